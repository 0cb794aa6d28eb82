"""Which stored chunks answer a question: the embedder (`embeddings`), BM25 (`lexical`), their fusion (`rank`)
and the search over a store (`search`)."""
