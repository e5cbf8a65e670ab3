"""The ULMFiT demo, its recipe (`ulmfit`) and its kill-and-resume job harness (`jobs`): not part of `fastrepro.all`.
Imports from every folder below it."""
