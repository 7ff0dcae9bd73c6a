"""The notebook one notes extraction writes in (`app.notes.rules.extract`): the items found so far,
by section, and every earlier item (the previous notes', then this run's) that a correction, a
retraction or an update resolves against."""

from app.notes.schemas import SECTION_NAMES, NoteItem, Notes, SectionName, Source


class Notebook:
    """Accumulates items; earlier items (from `previous` and this run) resolve corrections."""

    def __init__(self, previous: Notes | None) -> None:
        self.found: dict[SectionName, list[NoteItem]] = {name: [] for name in SECTION_NAMES}
        self.context: list[tuple[SectionName, NoteItem]] = [
            (name, item) for name, items in (previous or Notes()).sections() for item in items
        ]

    def add(self, section: SectionName, text: str, seq: int, source: Source, subject: str | None,
            trusted: bool = True, seqs: tuple[int, ...] = ()) -> None:  # fmt: skip
        item = NoteItem(
            text=text.strip(), seq=seq, subject=subject, source=source, trusted=trusted, seqs=seqs
        )
        self.found[section].append(item)
        self.context.append((section, item))

    def earlier(self, section: SectionName) -> list[NoteItem]:
        """Earlier items of a section, newest first."""
        return [item for name, item in reversed(self.context) if name == section]

    def containing(self, needle: str) -> tuple[SectionName, NoteItem] | None:
        found = (e for e in reversed(self.context) if needle.casefold() in e[1].text.casefold())
        return next(
            (e for e in found if e[0] in ("goal", "constraints", "decisions", "open")), None
        )
