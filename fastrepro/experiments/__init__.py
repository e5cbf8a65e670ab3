"""Several runs, recorded and compared honestly: the statistics over seeds (`stats`), the run ledger, its stores and
its spool (`store`, `spool`, `ledger`), a fit's record in it (`fit_record`), and the seeds run on any executor
(`sweep`). Imports from `fastrepro.state`, `fastrepro.checkpoint` and
`fastrepro.record`."""
