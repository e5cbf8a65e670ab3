"""The callbacks a fastai user adds: `ReproCB` (`repro`), `ReproMixedPrecision` (`fp16`) and `CheckpointCB`
(`preempt`). Imports from `fastrepro.state`, `fastrepro.checkpoint`, `fastrepro.record` and `fastrepro.experiments`."""
