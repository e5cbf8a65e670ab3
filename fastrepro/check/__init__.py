"""Is it the same, here and elsewhere: a checkpoint's code rebuilt (`rebuild`), re-run to its position (`rerun`),
compared and judged (`verdict`, `reproduce`), and the guarantees proven on this installation (`proof`, `fastrepro
selftest`). Imports from every folder below it: `state`, `checkpoint`, `record`,
`experiments`, `callback`."""
