"""Integrations with other libraries; each one is an optional extra (`pip install 'vgc[transformers]'`) and is
imported only by name (`from vgc.integrations import transformers`)."""
