"""The bits and what keeps them exact: seeds and generator states (`rng`), the deterministic switches and CPU kernels
(`kernels`, `portable`), the environment that decides the bits (`environment`), the data streams and the guard on
fastai's `DataLoader` (`data`, `passes`), the ranks of a distributed run (`distrib`), the checkpoint format, the bytes
every read checks and the formats of fastrepro's own callbacks (`checkpoint`, `integrity`, `formats`), fastai's own
state (`fastai_state`), the resume plan (`resume`), the model audit (`audit`), and the fit hooks they share (`core`).
The bottom floor: it imports nothing else of fastrepro."""
