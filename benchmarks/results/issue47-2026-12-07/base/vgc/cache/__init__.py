"""The on-disk compile cache: key factors, the artifact store, debug files and the `vgc cache` commands."""
