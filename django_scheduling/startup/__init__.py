"""Which process runs a scheduler (``argv``), and starting it with the web processes
(``autostart``)."""
