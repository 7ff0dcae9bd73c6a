"""Tool-calling trajectories (`contextd eval agent`, issue #34): the data and the pure measures.

No I/O beyond reading the data file. The driver (`app.eval.agent_driver`) replays the runs into a
running contextd over HTTP; the baselines (`app.eval.agent_baselines`) are computed here, locally.

A *step* is an assistant message that calls tools: the prompt is built just before it, from the
system prompt and every message before it. Definitions (the report's header repeats them):

- **value**: a leaf of a call's JSON arguments (strings as they are, numbers as their JSON text;
  booleans and null are not values), kept when at least `MIN_VALUE_CHARS` characters long.
- **dependency** of a step: a value of one of the step's calls that is a substring of an earlier
  `tool` message's content and of neither the system prompt nor any earlier `user` message — a
  value the agent can only have read from a tool result. Each distinct value counts once a step.
- **present**: the dependency is a substring of the prompt's text — every message's content and
  every tool call's name and arguments (`prompt_text`).
- **labels** of a dependency: the JSON keys it was found under in the earlier tool results (the
  nearest key above a leaf whose text holds it, or above a dict key that holds it) and the names
  of the tools whose results held it.
- **labelled**: present together with what it is — (a) inside a `tool` message of the prompt
  whose content is a JSON object or array holding it under a key, or (b) on one line of any
  message (content lines; a tool call is one line `name arguments`) where one of its labels, as a
  whole word and in any case, ends before the value starts.
- **prefix reuse** of a build: the tokens that the serialized prompt (`serialise`) shares from
  its start with the previous build's of the same session, over its own tokens — what a
  provider's prompt cache can reuse. Token sequences are compared (cl100k), as a cache does.
- **validity** (`validity_problems`): every `tool` message directly follows the assistant message
  holding its call or a sibling result of it; every call of an assistant message is answered
  before the next non-tool message; no call is left unanswered at the end; no call id appears
  twice in one assistant message.
"""

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.domain.tokens import encoding

MIN_VALUE_CHARS = 4
WIRE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")


# ---------------------------------------------------------------- data


@dataclass(frozen=True, slots=True)
class Step:
    """One assistant message that calls tools, and what its calls depend on."""

    index: int  # position in `AgentRun.messages`: the prompt is built from messages[:index]
    ordinal: int  # 0 for the run's first step
    dependencies: tuple[str, ...]
    labels: Mapping[str, frozenset[str]]  # dependency -> its labels


@dataclass(frozen=True, slots=True)
class AgentRun:
    """One recorded trajectory: the system prompt, then the messages after it."""

    task_id: int
    trial: int
    reward: float
    system: str
    messages: tuple[dict[str, Any], ...]
    steps: tuple[Step, ...] = field(default=())

    @property
    def key(self) -> str:
        return f"t{self.task_id}-r{self.trial}"


def parse_run(sample: Mapping[str, Any]) -> AgentRun:
    traj = list(sample["traj"])
    if not traj or traj[0].get("role") != "system":
        raise ValueError(f"task {sample.get('task_id')}: the trajectory must open with its system")
    system = str(traj[0].get("content") or "")
    messages = tuple(dict(m) for m in traj[1:])
    return AgentRun(
        task_id=int(sample["task_id"]),
        trial=int(sample["trial"]),
        reward=float(sample.get("reward") or 0.0),
        system=system,
        messages=messages,
        steps=tuple(find_steps(system, messages)),
    )


def load_runs(
    path: str | Path, tasks: Iterable[int] | None = None, trials: Iterable[int] | None = None
) -> list[AgentRun]:
    """The runs of a tau-bench style file, in (task, trial) order, restricted when asked."""
    wanted_tasks = set(tasks) if tasks is not None else None
    wanted_trials = set(trials) if trials is not None else None
    runs = [
        parse_run(s)
        for s in json.loads(Path(path).read_text())
        if (wanted_tasks is None or int(s["task_id"]) in wanted_tasks)
        and (wanted_trials is None or int(s["trial"]) in wanted_trials)
    ]
    return sorted(runs, key=lambda r: (r.task_id, r.trial))


def parse_ranges(text: str) -> tuple[int, ...]:
    """`"0-11,14"` -> (0, 1, ..., 11, 14)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return tuple(out)


# ---------------------------------------------------------------- dependencies


def _json(text: str) -> Any:
    """`text` parsed with numbers kept as their text; None when it is not JSON."""
    try:
        return json.loads(text, parse_int=str, parse_float=str)
    except ValueError:
        return None


def leaf_values(node: Any) -> Iterator[str]:
    """The leaves of parsed JSON as text (numbers parsed as text by `_json`), booleans and null
    left out."""
    if isinstance(node, dict):
        for value in node.values():
            yield from leaf_values(value)
    elif isinstance(node, list):
        for value in node:
            yield from leaf_values(value)
    elif isinstance(node, str):
        yield node


def argument_values(arguments: str | None) -> list[str]:
    """A call's argument values of at least `MIN_VALUE_CHARS` characters, distinct, in order;
    none when the arguments are not JSON."""
    parsed = _json(arguments or "")
    if not isinstance(parsed, dict | list):
        return []
    return list(dict.fromkeys(v for v in leaf_values(parsed) if len(v) >= MIN_VALUE_CHARS))


def keys_holding(node: Any, value: str, parent: str | None = None) -> set[str]:
    """The nearest keys under which parsed JSON holds `value`: the key above each leaf whose text
    contains it, and the key above each dict key that contains it."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, child in node.items():
            if parent is not None and value in key:
                found.add(parent)
            found |= keys_holding(child, value, key)
    elif isinstance(node, list):
        for child in node:
            found |= keys_holding(child, value, parent)
    elif isinstance(node, str) and parent is not None and value in node:
        found.add(parent)
    return found


def _tool_name(message: Mapping[str, Any], calls: Mapping[str, str]) -> str:
    return str(message.get("name") or calls.get(str(message.get("tool_call_id")), ""))


def find_steps(system: str, messages: Sequence[Mapping[str, Any]]) -> list[Step]:
    """Every assistant message with tool calls, with its dependencies and their labels."""
    steps: list[Step] = []
    call_names: dict[str, str] = {}  # call id -> function name (the latest call with that id)
    tool_results: list[tuple[str, str, Any]] = []  # (content, tool name, parsed JSON or None)
    user_texts: list[str] = []
    for index, message in enumerate(messages):
        calls = message.get("tool_calls") or []
        if message.get("role") == "assistant" and calls:
            values = [v for c in calls for v in argument_values(_arguments(c))]
            deps = [
                v
                for v in dict.fromkeys(values)
                if any(v in content for content, _, _ in tool_results)
                and v not in system
                and not any(v in text for text in user_texts)
            ]
            labels = {
                v: frozenset(
                    label
                    for content, name, parsed in tool_results
                    if v in content
                    for label in ({name} if name else set()) | keys_holding(parsed, v)
                )
                for v in deps
            }
            steps.append(Step(index, len(steps), tuple(deps), labels))
            for call in calls:
                call_names[str(call.get("id"))] = str((call.get("function") or {}).get("name", ""))
        role, content = message.get("role"), str(message.get("content") or "")
        if role == "tool":
            tool_results.append((content, _tool_name(message, call_names), _json(content)))
        elif role == "user":
            user_texts.append(content)
    return steps


def _arguments(call: Mapping[str, Any]) -> str:
    arguments = (call.get("function") or {}).get("arguments")
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


# ---------------------------------------------------------------- presence in a prompt


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _call_lines(message: Mapping[str, Any]) -> list[str]:
    return [
        f"{(c.get('function') or {}).get('name', '')} {_arguments(c)}"
        for c in message.get("tool_calls") or []
    ]


def prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """Everything a model reads of a prompt: each message's content, each call's name and
    arguments, one after the other."""
    return "\n".join(part for m in messages for part in (_content(m), *_call_lines(m)) if part)


def present(dependencies: Iterable[str], text: str) -> list[str]:
    """The dependencies that are substrings of `text` (from `prompt_text`)."""
    return [d for d in dependencies if d in text]


def _label_re(labels: Iterable[str]) -> re.Pattern[str] | None:
    words = sorted({label for label in labels if label}, key=len, reverse=True)
    if not words:
        return None
    alternatives = "|".join(re.escape(w) for w in words)
    return re.compile(rf"(?<![A-Za-z0-9_])(?:{alternatives})(?![A-Za-z0-9_])", re.IGNORECASE)


def labelled_on_line(line: str, value: str, labels: re.Pattern[str] | None) -> bool:
    """Whether a label ends on `line` before an occurrence of `value` starts."""
    if labels is None or value not in line:
        return False
    last_start = line.rfind(value)
    return any(m.end() <= last_start for m in labels.finditer(line, 0, last_start))


def labelled(
    dependencies: Iterable[str],
    labels: Mapping[str, Iterable[str]],
    messages: Sequence[Mapping[str, Any]],
) -> list[str]:
    """The dependencies the prompt holds with what they are (the module's definition)."""
    parsed_results = [
        parsed
        for m in messages
        if m.get("role") == "tool" and isinstance(parsed := _json(_content(m)), dict | list)
    ]
    lines = [
        line
        for m in messages
        for part in (_content(m), *_call_lines(m))
        for line in part.splitlines()
    ]
    out = []
    for dep in dependencies:
        if any(keys_holding(p, dep) for p in parsed_results):
            out.append(dep)
            continue
        pattern = _label_re(labels.get(dep, ()))
        if any(labelled_on_line(line, dep, pattern) for line in lines if dep in line):
            out.append(dep)
    return out


# ---------------------------------------------------------------- prefix reuse


def serialise(messages: Sequence[Mapping[str, Any]]) -> str:
    """A prompt as a provider receives it: each message's wire fields as JSON, in order, one a
    line (content, calls and ids byte for byte; keys sorted, so that how a client orders them
    does not count)."""
    return "\n".join(
        json.dumps(
            {k: m[k] for k in WIRE_FIELDS if m.get(k) is not None},
            ensure_ascii=False,
            sort_keys=True,
        )
        for m in messages
    )


def serial_tokens(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """The cl100k tokens of `serialise(messages)`."""
    return encoding().encode(serialise(messages), disallowed_special=())


def common_prefix(earlier: Sequence[int], later: Sequence[int]) -> int:
    """The length of the longest common prefix of two token sequences."""
    n = min(len(earlier), len(later))
    for i in range(n):
        if earlier[i] != later[i]:
            return i
    return n


# ---------------------------------------------------------------- validity


def validity_problems(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """What a provider would reject in the message list (empty: valid), per the module's rules."""
    problems: list[str] = []
    pending: list[str] = []  # calls of the current assistant message not answered yet
    in_results = False  # the previous message is that assistant message or one of its results
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            call_id = str(m.get("tool_call_id"))
            if not in_results:
                problems.append(f"[{i}] tool result {call_id} not right after its call")
            elif call_id not in pending:
                problems.append(f"[{i}] tool result {call_id} answers no pending call")
            else:
                pending.remove(call_id)
            continue
        if pending:
            problems.append(f"[{i}] calls {', '.join(pending)} unanswered before a {role} message")
        calls = [str(c.get("id")) for c in m.get("tool_calls") or []]
        if len(set(calls)) < len(calls):
            problems.append(f"[{i}] a call id repeated in one message")
        pending = calls if role == "assistant" else []
        in_results = bool(pending)
    if pending:
        problems.append(f"[end] calls {', '.join(pending)} never answered")
    return problems
