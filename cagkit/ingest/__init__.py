"""Ingest: find and read documents (`documents`), cut them into chunks (`chunking`), prefill each chunk with the
source model and write its KV to the store (`pipeline`)."""
