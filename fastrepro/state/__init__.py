"""The bits and what keeps them exact: seeds and generator states (`rng`), the deterministic switches and CPU kernels
(`kernels`, `portable`), the environment that decides the bits (`environment`), the data streams and the guard on
fastai's `DataLoader` (`data`, `passes`), the ranks of a distributed run (`distrib`), the model audit (`audit`), and
the fit hooks they share (`core`). The bottom floor: it imports nothing else of fastrepro."""
