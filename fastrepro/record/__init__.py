"""What ran, written where people look: how a run was started (`entry`), its code and provenance (`provenance`), what
every iteration did and where two runs part (`trace`), the TensorBoard, W&B, MLflow and CSV runs it continues
(`trackers`), and whose records `reproduce` runs without asking (`trust`). Imports from `fastrepro.state` and
`fastrepro.checkpoint`."""
