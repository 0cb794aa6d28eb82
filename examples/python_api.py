"""cagkit's Python API on the bundled docs: ingest them once, then ask a question and stream the answer.

    python examples/python_api.py

The first run prefills the documents with smollm2 (a few seconds); later runs find them unchanged and skip them.
The store goes to stores/examples/python_api.
"""

from pathlib import Path

import cagkit

HERE = Path(__file__).resolve().parent
DOCS = HERE / "docs"
STORE = HERE.parent / "stores" / "examples" / "python_api"


def main() -> None:
    report = cagkit.ingest([DOCS], store=STORE, source="smollm2", progress=False)
    print(f"ingest: {len(report.added)} added, {len(report.updated)} updated, {len(report.unchanged)} unchanged, "
          f"{report.chunks} chunks prefilled -> {STORE}")

    question = "What file holds the settings of a store?"
    print(f"\nQ: {question}")
    answer = cagkit.ask(question, store=STORE, model="smollm2", top_k=2,
                        on_text=lambda piece: print(piece, end="", flush=True))
    print("\n\nsources:")
    for source in answer.sources:
        print(f"  {source['score']:.3f}  {Path(source['document']).name}  chunk {source['chunk']}")
    print(f"\n{answer.model} ({answer.mode}), {answer.context_tokens} context tokens, "
          f"first token after {answer.timings['ttft_ms']:.0f} ms")


if __name__ == "__main__":
    main()
