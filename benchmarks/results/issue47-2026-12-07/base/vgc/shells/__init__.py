"""The shells around the library: the `vgc` command (`cli`) and what only it runs, the offline cache tooling
(`cache_cli`; bundles: `bundle`, `bundle_check`, `bundle_manifest`; `verify`), `vgc profile` (`profile_cli`),
`vgc demo` and the benchmarks (`bench`). Nothing below imports from here: a process that serves a model never
loads them, and they may use every layer of the library."""
