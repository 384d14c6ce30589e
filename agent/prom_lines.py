"""Read only the wanted sample lines of Prometheus text exposition, exactly, and skip everything else.

A vLLM /metrics body is ~600 lines (~70 kB), of which the agent reads ~120; prometheus_client's parser is
pure Python and builds a family object per metric, which made parsing the largest item of the agent's
CPU at a 1 s scrape of 8 engines. This reader looks at a line's name first (a ``str.startswith`` and one
dict lookup) and parses labels and value only for the names asked for. What it parses, it parses strictly
(the text format's escapes, ``+Inf``/``NaN``, an optional timestamp); a wanted line it cannot read is an
error, never a silently wrong number. ``tests/agent/test_prom_lines.py`` checks it against
prometheus_client's parser on recorded real vLLM output.

Two rules bound what a body can make of the samples read (``SeriesError``): a series is one sample per body
(the same name and labels twice is refused, as Prometheus refuses a "duplicate sample for timestamp"), and a
body holds at most ``max_samples`` wanted samples, counted before any is parsed. Summing the samples of one
name is only ever summing distinct series (the engines of a data-parallel vLLM), never a line sent twice.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Collection

Sample = tuple[dict[str, str], float]
# The wanted samples of one body as (name, label block) pairs in the body's order: what stays the same between
# two scrapes of one engine.
Shape = tuple[tuple[str, str], ...]

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*(?:,|$)')
_NAME_END = re.compile(r"[{\s]")
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_SPECIAL = {"+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}


class PromTextError(ValueError):
    """A wanted sample line that is not valid Prometheus text."""


class SeriesError(PromTextError):
    """Wanted samples that are valid lines but no valid body: a series sent twice, or more than the bound."""


# Far past any engine: vLLM sends 78 wanted samples per engine (a data-parallel engine of 64 ranks ~5,000).
MAX_SAMPLES = 10_000


def _unescape(value: str) -> str:
    return re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], value) if "\\" in value else value


def _labels(block: str, line: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    block = block.rstrip()
    while pos < len(block):
        match = _LABEL.match(block, pos)
        if match is None or match.end() == pos:
            raise PromTextError(f"bad labels in {line[:200]!r}")
        labels[match.group(1)] = _unescape(match.group(2))
        pos = match.end()
    return labels


def _value(text: str, line: str) -> float:
    special = _SPECIAL.get(text)
    if special is not None:
        return special
    try:
        return float(text)
    except ValueError as exc:
        raise PromTextError(f"bad value in {line[:200]!r}") from exc


def parse_line(line: str) -> tuple[str, dict[str, str], float]:
    """One sample line ``name{labels} value [timestamp]`` -> (name, labels, value); ``PromTextError`` if not."""
    match = _NAME_END.search(line)
    if match is None:
        raise PromTextError(f"no value in {line[:200]!r}")
    name = line[:match.start()]
    rest = line[match.start():]
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        close = _closing_brace(rest)
        if close < 0:
            raise PromTextError(f"unclosed labels in {line[:200]!r}")
        labels = _labels(rest[1:close], line)
        rest = rest[close + 1:]
    parts = rest.split()
    if not name or not 1 <= len(parts) <= 2:
        raise PromTextError(f"not a sample line: {line[:200]!r}")
    return name, labels, _value(parts[0], line)


def _closing_brace(text: str) -> int:
    """Index of the ``}`` that ends the label block starting at ``text[0]``, skipping quoted values."""
    quoted = escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = quoted
        elif ch == '"':
            quoted = not quoted
        elif ch == "}" and not quoted:
            return i
    return -1


def _common_prefix(names: list[str]) -> str:
    """The characters every name starts with (``vllm:`` for the engine table)."""
    if not names:
        return ""
    first, last = min(names), max(names)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


class SampleSelector:
    """Finds the sample lines of ``names`` with compiled regular expressions (the scan and the split into
    name, label block and value run in C) and remembers parsed label blocks: between two scrapes of the
    same engine they repeat exactly, only the values change. The cache is bounded; a label block is a few
    hundred bytes at most. A wanted line the strict expression does not take is parsed by ``parse_line``,
    which says what is wrong with it."""

    def __init__(self, names: Collection[str], max_cached: int = 8192, max_samples: int = MAX_SAMPLES) -> None:
        # "\n" + a literal common prefix first lets the regex engine jump from line to line by fast search;
        # a leading "^" in MULTILINE mode would try every character (4x slower on vLLM's text).
        prefix = _common_prefix(list(names))
        name = re.escape(prefix) + "(?:" + "|".join(
            re.escape(n[len(prefix):]) for n in sorted(names, key=len, reverse=True)) + ")"
        self._lines = re.compile(rf"\n({name}(?:[{{ \t][^\n]*)?)(?=\n|$)")
        self._samples = re.compile(rf"\n({name})(\{{[^\n]*\}})?[ \t]+([^ \t\r\n]+)(?:[ \t]+-?[0-9]+)?[ \t]*\r?(?=\n|$)")
        # Parsed label blocks, with the set of their labels (what tells two series apart, in any order).
        self._labels: dict[str, tuple[dict[str, str], frozenset[tuple[str, str]]]] = {}
        self.max_cached = max_cached
        self.max_samples = max_samples
        # Every wanted line starts with "\n" + the common prefix and is longer than the shortest name: a body
        # shorter than this cannot hold more than ``max_samples`` of them.
        self._line_start = "\n" + prefix
        self._countless = max_samples * (min((len(n) for n in names), default=0) + 3)
        self._shapes: set[Shape] = set()  # the shapes ``shaped`` has checked: one per kind of engine, bounded
        self.max_shapes = 64

    def select(self, text: str) -> dict[str, list[Sample]]:
        """The samples of the wanted names in exposition ``text``; other lines are never parsed.

        ``SeriesError`` for a series sent twice or more than ``max_samples`` wanted samples."""
        text = "\n" + text
        # A body that may hold more than the bound is counted first (in C, nothing built), and past the bound
        # read only up to the line past it: never every line of an engine that streams without end.
        if len(text) > self._countless and text.count(self._line_start) > self.max_samples:
            past = next(itertools.islice(self._lines.finditer(text), self.max_samples, None), None)
            if past is not None:
                self._read(text[:past.start()])  # a series sent twice says more than the count: said first
                raise SeriesError(f"more than {self.max_samples} samples of the series read (an engine sends "
                                  f"about 80)")
        return self._read(text)

    def shaped(self, text: str) -> tuple[Shape, list[float]] | None:
        """The wanted samples as their shape (each one's name and label block, in the body's order) and their
        values, for a reader that turns a shape it has read before into figures without parsing it again
        (``agent.engine_metrics``): between two scrapes of one engine only the values change. A shape is
        returned only once ``select`` took a body of that shape (its labels parsed, no series twice), so the
        same refusals hold. None where the fast form does not take every wanted line: ``select`` reads it."""
        body = "\n" + text
        if len(body) > self._countless and body.count(self._line_start) > self.max_samples:
            self.select(text)  # raises: more than the bound (or a series twice, said first)
        found = self._samples.findall(body)
        if len(found) != len(self._lines.findall(body)):
            return None
        shape = tuple([(name, block) for name, block, _ in found])
        if shape not in self._shapes:
            # What ``select`` refuses (labels it cannot read, a series twice) is a matter of the shape alone.
            self._read(body)
            if len(self._shapes) >= self.max_shapes:
                self._shapes.clear()
            self._shapes.add(shape)
        try:
            values = list(map(float, [value for _, _, value in found]))  # float() reads +Inf, -Inf and NaN too
        except ValueError:
            self._read(body)  # raises, naming the line
            raise
        return shape, values

    def labels_of(self, block: str) -> dict[str, str]:
        """The labels of a label block of a shape ``shaped`` returned (``{...}``, or "" for none)."""
        cached = self._labels.get(block)
        return cached[0] if cached is not None else (_labels(block[1:-1], block) if block else {})

    def _read(self, text: str) -> dict[str, list[Sample]]:
        found = self._samples.findall(text)
        out: dict[str, list[Sample]] = {}
        if len(found) != len(self._lines.findall(text)):
            # A wanted line the fast form does not take (a float timestamp, or no sample at all): the exact
            # line parser reads it, or says what is wrong with it.
            for match in self._lines.finditer(text):
                name, labels, value = parse_line(match.group(1).rstrip("\r"))
                out.setdefault(name, []).append((labels, value))
            _no_repeats(out, {(name, frozenset(lb.items())) for name, rows in out.items() for lb, _ in rows})
            return out
        cache = self._labels
        series: set[tuple[str, frozenset[tuple[str, str]]]] = set()
        for name, block, value in found:
            cached = cache.get(block)
            if cached is None:
                labels = _labels(block[1:-1], name + block) if block else {}
                cached = labels, frozenset(labels.items())
                if len(cache) >= self.max_cached:
                    cache.clear()
                cache[block] = cached
            series.add((name, cached[1]))
            out.setdefault(name, []).append((cached[0], _value(value, name + block)))
        _no_repeats(out, series)
        return out


def _no_repeats(out: dict[str, list[Sample]], series: set[tuple[str, frozenset[tuple[str, str]]]]) -> None:
    """``SeriesError`` when ``out`` holds fewer distinct ``series`` than samples: a series sent twice (Prometheus
    refuses it too, "duplicate sample for timestamp"); summed, it would be a number the engine never had."""
    if len(series) == sum(len(rows) for rows in out.values()):
        return
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for name, rows in out.items():
        for labels, _ in rows:
            key = (name, frozenset(labels.items()))
            if key in seen:
                shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
                raise SeriesError(f"duplicate series {name}{{{shown}}}"[:300]
                                  + ": the same name and labels twice in one body")
            seen.add(key)


def select_samples(text: str, names: Collection[str]) -> dict[str, list[Sample]]:
    """The samples of ``names`` in exposition ``text`` (comments and other names skipped unparsed)."""
    return SampleSelector(names).select(text)
