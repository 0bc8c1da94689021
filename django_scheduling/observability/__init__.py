"""What operators see: the run events and what feeds on them (metrics, Sentry Crons, failure
alerts), the states of the tasks (overdue, failing), the health report and the probes, and the
outcomes that engines report of enqueued runs."""
