"""cagkit under LlamaIndex on the bundled docs: load them with SimpleDirectoryReader, build a store from the
Documents, retrieve nodes with CAGRetriever, and stream an answer from CAGQueryEngine.

    pip install 'cagkit[llama-index]'    # llama-index-core
    python examples/llama_index_example.py

The store goes to stores/examples/llama_index; a later run skips the unchanged documents.
"""

from pathlib import Path

from llama_index.core import SimpleDirectoryReader

from cagkit.integrations.llama_index import CAGQueryEngine, CAGRetriever, ingest_documents

HERE = Path(__file__).resolve().parent
DOCS = HERE / "docs"
STORE = HERE.parent / "stores" / "examples" / "llama_index"


def main() -> None:
    # filename_as_id gives each Document a stable id, so unchanged files are skipped on the next run.
    reader = SimpleDirectoryReader(str(DOCS), filename_as_id=True)
    report = ingest_documents(reader, store=STORE, source="smollm2", progress=False)
    print(f"ingest: {len(report.added)} added, {len(report.updated)} updated, {len(report.unchanged)} unchanged, "
          f"{report.chunks} chunks prefilled -> {STORE}")

    question = "What file holds the settings of a store?"
    retriever = CAGRetriever(store=STORE, similarity_top_k=2)
    print(f"\nretrieved for: {question}")
    for scored in retriever.retrieve(question):
        meta = scored.node.metadata
        print(f"  {scored.score:.3f}  {meta['file_name']}  chunk {meta['chunk_index']}: "
              f"{scored.node.get_content()[:60]!r}…")

    engine = CAGQueryEngine(retriever, model="smollm2", streaming=True)
    response = engine.query(question)
    print(f"\nQ: {question}\nA: ", end="")
    response.print_response_stream()
    print(f"\n\n{response.metadata['model']} ({response.metadata['mode']}), "
          f"{response.metadata['context_tokens']} context tokens, "
          f"first token after {response.metadata['timings']['ttft_ms']:.0f} ms")


if __name__ == "__main__":
    main()
