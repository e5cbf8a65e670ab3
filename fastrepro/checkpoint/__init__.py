"""Everything about a checkpoint on disk, read without any callback: its files' names (`files`), the bytes every read
checks (`integrity`), the formats of fastrepro's own callbacks and their upgrades (`formats`), the trace file beside it
(`trace_file`), the file and fastai's `save`/`load` that carry every stateful callback's state (`file`), its digests
and the manifest that keeps them (`manifest`), what it keeps of fastai's own state (`fastai_state`), and whose run it
is and how a fit resumes it (`resume`). Imports `fastrepro.state`."""
