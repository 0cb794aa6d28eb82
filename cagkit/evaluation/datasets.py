"""Question-answering examples for `cagkit eval`, read from five file formats.

Formats (`load_examples(format=...)`, `cagkit eval --format`; guessed from the first record if absent):

jsonl     our contract: one JSON object a line with "id" (str), "question" (str), "answers" ([str]),
          and either "context" (str, one document) or "documents" ([str]). Closed-set items add
          "choices" ([str]) and "answer_index" (int), and "answers" holds the correct choice's text.
squad     SQuAD v2 JSON {"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}.
          Answerable questions only; the context is the whole article (paragraphs joined by a
          blank line), since cagkit tests long documents; answers are the distinct gold spans.
hotpotqa  IRCoT HotpotQA JSONL {"question_id", "question_text", "answers_objects": [{"spans"}],
          "contexts": [{"title", "paragraph_text"}]}; each paragraph becomes "title\\ntext".
leval     L-Eval JSONL, one document a line: {"input", "instructions", "outputs", "evaluation"}.
          "exam" tasks (tpo, quality) inline four options in the instruction ("A. ..." or
          "(A) ..." lines) and give the gold as "B" or "(B) text"; the options become `choices`.
          Other tasks (scientific_qa) are free-form; an instruction repeated within a document
          (QASPER's several annotators) becomes one example with all its outputs as answers.
          Ids are "<file stem>-<line>-<k>": 1-based line, 0-based index into "instructions".
race      RACE JSONL {"example_id", "question_id", "article", "question", "options", "answer"};
          ids are "<example_id without .txt>-<question_id>".

Every example is checked against the jsonl contract; problems raise CagkitError naming the file,
the line (or SQuAD article) and what is wrong.
"""

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path

from cagkit.errors import CagkitError
from cagkit.evaluation.metrics import letter_or_text_to_index

FORMATS = ("jsonl", "squad", "hotpotqa", "leval", "race")

# Keys that identify each format in its first record; the first match wins.
_SIGNATURES = (
    ("squad", {"data"}),
    ("hotpotqa", {"question_id", "question_text", "contexts"}),
    ("leval", {"input", "instructions", "outputs"}),
    ("race", {"article", "options", "answer"}),
    ("jsonl", {"id", "question"}),
)
# An option line inside an L-Eval instruction: "A. text" (tpo) or " (A) text" (quality).
_OPTION = re.compile(r"^[ \t]*(?:\(([A-Z])\)|([A-Z])\.)[ \t]*", re.MULTILINE)


@dataclass
class Example:
    """One question over one long document (`context`) or several (`documents`)."""

    id: str
    question: str
    answers: list[str]  # gold answers; closed-set: the text of the correct choice
    context: str | None = None
    documents: list[str] | None = None
    choices: list[str] | None = None  # closed-set options, in letter order A, B, ...
    answer_index: int | None = None  # index of the correct choice

    def context_documents(self) -> list[str]:
        """The documents to cache for this question: [context] or documents."""
        return [self.context] if self.context is not None else list(self.documents)


def load_examples(path, format: str | None = None, limit: int | None = None) -> list[Example]:
    """Read the first `limit` examples (all if None) of `path` in `format` (detected if None)."""
    path = Path(path)
    format = format or detect_format(path)
    if format not in _READERS:
        raise CagkitError(f"unknown dataset format {format!r}; --format takes one of {', '.join(FORMATS)}")
    if limit is not None and limit < 1:
        raise CagkitError(f"--limit must be at least 1, got {limit}")
    examples = list(islice(_READERS[format](path), limit))
    if not examples:
        raise CagkitError(f"{path}: no usable questions in this {format} file; check the file or --format")
    _check_unique_ids(path, examples)
    return examples


def detect_format(path) -> str:
    """The format of `path`, judged by the keys of its first record."""
    path = Path(path)
    record = _first_record(path)
    for format, keys in _SIGNATURES:
        if keys <= record.keys():
            return format
    raise CagkitError(
        f"{path}: cannot tell the dataset format from its first record (keys: {', '.join(sorted(record))}); "
        f"pass --format with one of {', '.join(FORMATS)}"
    )


def split_options(instruction: str) -> tuple[str, list[str]]:
    """Split an instruction into its question stem and its lettered option texts.

    Returns (instruction stripped, []) unless the option lines run A, B, C, ... in order.
    """
    matches = list(_OPTION.finditer(instruction))
    letters = "".join(m.group(1) or m.group(2) for m in matches)
    if len(matches) < 2 or letters != "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[: len(matches)]:
        return instruction.strip(), []
    ends = [m.start() for m in matches[1:]] + [len(instruction)]
    choices = [instruction[m.end() : end].strip() for m, end in zip(matches, ends)]
    return instruction[: matches[0].start()].strip(), choices


# --- readers: each yields Examples; per-record converters raise KeyError/TypeError on bad shapes.


def _read_jsonl(path: Path) -> Iterator[Example]:
    return _read_lines_with(path, _jsonl_examples)


def _jsonl_examples(record: dict, where: str) -> Iterator[Example]:
    yield Example(
        id=record["id"],
        question=record["question"],
        answers=record["answers"],
        context=record.get("context"),
        documents=record.get("documents"),
        choices=record.get("choices"),
        answer_index=record.get("answer_index"),
    )


def _read_squad(path: Path) -> Iterator[Example]:
    data = _load_json(path)
    articles = data.get("data") if isinstance(data, dict) else None
    if not isinstance(articles, list):
        raise CagkitError(f"{path}: not SQuAD JSON (no 'data' list of articles); pass --format to choose a reader")
    for number, article in enumerate(articles):
        yield from _checked(_squad_examples, article, f"{path}, article {number}")


def _squad_examples(article: dict, where: str) -> Iterator[Example]:
    paragraphs = article["paragraphs"]
    context = "\n\n".join(paragraph["context"] for paragraph in paragraphs)
    for paragraph in paragraphs:
        for qa in paragraph["qas"]:
            if qa.get("is_impossible", False):
                continue
            answers = _distinct(answer["text"] for answer in qa["answers"])
            yield Example(id=qa["id"], question=qa["question"], answers=answers, context=context)


def _read_hotpotqa(path: Path) -> Iterator[Example]:
    return _read_lines_with(path, _hotpotqa_examples)


def _hotpotqa_examples(record: dict, where: str) -> Iterator[Example]:
    answers = _distinct(span for answer in record["answers_objects"] for span in answer["spans"])
    documents = [f"{paragraph['title']}\n{paragraph['paragraph_text']}" for paragraph in record["contexts"]]
    yield Example(id=record["question_id"], question=record["question_text"], answers=answers, documents=documents)


def _read_leval(path: Path) -> Iterator[Example]:
    for number, record in _jsonl_records(path):
        convert = partial(_leval_examples, prefix=f"{path.stem}-{number}")
        yield from _checked(convert, record, f"{path}, line {number}")


def _leval_examples(record: dict, where: str, prefix: str) -> Iterator[Example]:
    instructions, outputs = record["instructions"], record["outputs"]
    if len(instructions) != len(outputs):
        raise CagkitError(f"{where}: {len(instructions)} instructions but {len(outputs)} outputs; they must pair up")
    if record["evaluation"] == "exam":
        yield from _leval_closed(record, where, prefix)
    else:
        yield from _leval_free_form(record, prefix)


def _leval_closed(record: dict, where: str, prefix: str) -> Iterator[Example]:
    for k, (instruction, output) in enumerate(zip(record["instructions"], record["outputs"])):
        question, choices = split_options(instruction)
        if not choices:
            raise CagkitError(
                f"{where}, instruction {k}: no 'A. ...' or '(A) ...' option lines; "
                "only multiple-choice L-Eval exam tasks (tpo, quality) are supported"
            )
        index = letter_or_text_to_index(output, choices)
        if index is None:
            raise CagkitError(
                f"{where}, instruction {k}: gold output {output!r} names none of the {len(choices)} options"
            )
        yield Example(
            id=f"{prefix}-{k}",
            question=question,
            answers=[choices[index]],
            context=record["input"],
            choices=choices,
            answer_index=index,
        )


def _leval_free_form(record: dict, prefix: str) -> Iterator[Example]:
    # question -> (index of its first instruction, all its outputs), in first-seen order
    grouped: dict[str, tuple[int, list[str]]] = {}
    for k, (instruction, output) in enumerate(zip(record["instructions"], record["outputs"])):
        grouped.setdefault(instruction.strip(), (k, []))[1].append(output)
    for question, (k, outputs) in grouped.items():
        yield Example(id=f"{prefix}-{k}", question=question, answers=_distinct(outputs), context=record["input"])


def _read_race(path: Path) -> Iterator[Example]:
    return _read_lines_with(path, _race_examples)


def _race_examples(record: dict, where: str) -> Iterator[Example]:
    choices = record["options"]
    index = letter_or_text_to_index(record["answer"], choices)
    if index is None:
        raise CagkitError(f"{where}: answer {record['answer']!r} names none of the {len(choices)} options")
    yield Example(
        id=f"{record['example_id'].removesuffix('.txt')}-{record['question_id']}",
        question=record["question"],
        answers=[choices[index]],
        context=record["article"],
        choices=choices,
        answer_index=index,
    )


_READERS: dict[str, Callable[[Path], Iterator[Example]]] = {
    "jsonl": _read_jsonl,
    "squad": _read_squad,
    "hotpotqa": _read_hotpotqa,
    "leval": _read_leval,
    "race": _read_race,
}


# --- file access and validation


def _read_lines_with(path: Path, convert: Callable[[dict, str], Iterator[Example]]) -> Iterator[Example]:
    for number, record in _jsonl_records(path):
        yield from _checked(convert, record, f"{path}, line {number}")


def _checked(convert: Callable[[dict, str], Iterator[Example]], record: dict, where: str) -> Iterator[Example]:
    """Convert one record, turning shape errors into CagkitErrors and checking each example."""
    try:
        examples = list(convert(record, where))
    except KeyError as error:
        raise CagkitError(f"{where}: field {error.args[0]!r} is missing; is --format right?") from None
    except (TypeError, AttributeError, IndexError) as error:
        raise CagkitError(f"{where}: malformed record ({error}); is --format right?") from None
    for example in examples:
        _check_example(example, where)
        yield example


def _check_example(example: Example, where: str) -> None:
    """Enforce the jsonl contract on any example, wherever it was read from."""
    where = f"{where} (id {example.id!r})" if isinstance(example.id, str) and example.id else where
    problem = _contract_problem(example)
    if problem:
        raise CagkitError(f"{where}: {problem}")


def _contract_problem(example: Example) -> str | None:
    if not isinstance(example.id, str) or not example.id:
        return "'id' must be a non-empty string"
    if not isinstance(example.question, str) or not example.question.strip():
        return "'question' must be a non-empty string"
    if not _is_text_list(example.answers):
        return "'answers' must be a non-empty list of non-empty strings"
    if (example.context is None) == (example.documents is None):
        return "give exactly one of 'context' (a string) or 'documents' (a list of strings)"
    if example.context is not None and (not isinstance(example.context, str) or not example.context.strip()):
        return "'context' must be a non-empty string"
    if example.documents is not None and not _is_text_list(example.documents):
        return "'documents' must be a non-empty list of non-empty strings"
    if (example.choices is None) != (example.answer_index is None):
        return "closed-set questions need both 'choices' and 'answer_index'"
    if example.choices is not None:
        return _closed_set_problem(example)
    return None


def _closed_set_problem(example: Example) -> str | None:
    if not _is_text_list(example.choices) or len(example.choices) < 2:
        return "'choices' must list at least two non-empty strings"
    index = example.answer_index
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(example.choices):
        return f"'answer_index' must be an integer from 0 to {len(example.choices) - 1}, got {index!r}"
    if example.choices[index] not in example.answers:
        return f"'answers' must contain the correct choice's text {example.choices[index]!r}"
    return None


def _is_text_list(values) -> bool:
    return isinstance(values, list) and bool(values) and all(isinstance(v, str) and v.strip() for v in values)


def _check_unique_ids(path: Path, examples: list[Example]) -> None:
    # Results are keyed by id, so a repeated id would silently merge two questions.
    seen: set[str] = set()
    for example in examples:
        if example.id in seen:
            raise CagkitError(f"{path}: id {example.id!r} appears more than once; ids must be unique within a file")
        seen.add(example.id)


def _distinct(texts) -> list[str]:
    """Texts in first-seen order without repeats (SQuAD lists one span per annotator)."""
    return list(dict.fromkeys(texts))


def _jsonl_records(path: Path) -> Iterator[tuple[int, dict]]:
    """(1-based line number, object) for each non-blank line."""
    for number, line in _numbered_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise CagkitError(
                f"{path}, line {number}: not valid JSON ({error.msg}); each line must be one JSON object"
            ) from None
        if not isinstance(record, dict):
            raise CagkitError(f"{path}, line {number}: expected a JSON object, got {type(record).__name__}")
        yield number, record


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with path.open(encoding="utf-8") as file:
            yield from enumerate(file, start=1)
    except UnicodeDecodeError:
        raise CagkitError(f"{path}: not UTF-8 text; save the dataset as UTF-8") from None
    except OSError as error:
        raise CagkitError(f"{path}: cannot read the dataset ({error.strerror}); check the path") from None


def _load_json(path: Path):
    text = "".join(line for _, line in _numbered_lines(path))
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise CagkitError(f"{path}, line {error.lineno}: not valid JSON ({error.msg})") from None


def _first_record(path: Path) -> dict:
    """The first JSONL object, or the whole file when it is one (possibly pretty-printed) JSON value."""
    for _, line in _numbered_lines(path):
        if line.strip():
            break
    else:
        raise CagkitError(f"{path}: the dataset file is empty")
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        record = _load_json(path)
    if not isinstance(record, dict):
        raise CagkitError(
            f"{path}: expected JSON objects, got {type(record).__name__}; "
            f"pass --format with one of {', '.join(FORMATS)}"
        )
    return record
