"""Reference models traced by the vgc backend."""
