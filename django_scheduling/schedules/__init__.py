"""When tasks fire, and what a firing does, in pure code: cron expressions, durations, triggers,
the decisions of the firing path and the timeline. No Django, no database, no clock of their own:
every time comes in as an argument."""
