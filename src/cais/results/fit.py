"""Tables that fit the terminal, with no cell cut short.

rich fits a table that is too wide by narrowing its columns, and a cell whose word no
longer fits loses its end to an ellipsis (``layerno…``, ``14,563,555,555…``). On an
80-column terminal or in a pipe (where rich assumes 80 columns, or ``COLUMNS``) that
drops what a reader came for. :func:`fit` lays a table out so that every column is at
least as wide as its longest word, so cells wrap between words and never lose a
character, in three steps, the first that fits:

1. the table as it is, its columns narrowed (widest first) no further than their
   longest words;
2. the same with the headers that are wider than their column's cells replaced by
   short keys (``#1``, ``#2``, ...), explained in a legend line under the table;
3. vertically: one block per row, a ``column  value`` line per cell (a table
   without a header row, a list of quantities and values, instead folds a word too
   long for its column onto the next line).

The commands print every table through :func:`print_table`.
"""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["fit", "print_table"]

_WIDE = 1 << 16  # measuring width: wide enough that nothing is wrapped while measured


def _measure(console: Console, cell: RenderableType) -> tuple[int, int]:
    """(longest word, longest line) of a cell, in terminal cells."""
    if isinstance(cell, str):  # a table reads text cells as console markup
        cell = console.render_str(cell)
    m = Measurement.get(console, console.options.update_width(_WIDE), cell)
    return m.minimum, m.maximum


def _ranges(console: Console, table: Table, headers: bool = True) -> list[tuple[int, int]]:
    """Each column's (narrowest, widest) width with its padding: the narrowest is its
    longest word (``no_wrap`` columns: its longest line); ``headers``: count the
    header too."""
    out = []
    for i, col in enumerate(table.columns):
        cells: list[RenderableType] = list(col.cells)
        if headers and table.show_header:
            cells.append(col.header)
        if table.show_footer:
            cells.append(col.footer)
        sizes = [_measure(console, c) for c in cells] or [(0, 0)]
        lo, hi = max(s[0] for s in sizes), max(s[1] for s in sizes)
        if col.width is not None:
            lo = hi = col.width
        elif col.no_wrap:
            lo = hi
        pad = table._get_padding_width(i)
        out.append((lo + pad, max(lo, hi) + pad))
    return out


def _widths(ranges: list[tuple[int, int]], room: int, first: list[int] | None = None) -> list[int] | None:
    """Column widths that add up to at most ``room``, each between its narrowest and
    widest, narrowing the widest columns first, and none below ``first`` (the
    widths at which only headers wrap, not cells) while that is enough; None if the
    narrowest do not fit."""
    lo = [a for a, _ in ranges]
    if sum(lo) > room:
        return None
    widths = [b for _, b in ranges]
    excess = sum(widths) - room
    floors = [lo] if first is None else [[min(max(f, m), w) for f, m, w in zip(first, lo, widths)], lo]
    for floor in floors:
        while excess > 0 and any(w > m for w, m in zip(widths, floor)):
            top = max(w for w, m in zip(widths, floor) if w > m)
            for i, (w, m) in enumerate(zip(widths, floor)):
                if w == top and w > m and excess > 0:
                    widths[i] -= 1
                    excess -= 1
    return widths


def _set_widths(table: Table, widths: list[int]) -> None:
    for i, (col, w) in enumerate(zip(table.columns, widths)):
        col.width = max(1, w - table._get_padding_width(i))


def _room(table: Table, width: int) -> int:
    """The width left for the columns (with their padding) once the borders are drawn."""
    return width - table._extra_width


def _abbreviated(console: Console, table: Table, width: int) -> Text | None:
    """Replace, widest first, the headers that are wider than their column's cells by
    ``#1``, ``#2``, ... until the table fits ``width``; the legend that says what each
    key stands for (None, and the table as it was, if that does not make it fit)."""
    if not table.show_header:
        return None
    room = _room(table, width)
    full = _ranges(console, table)
    cells = _ranges(console, table, headers=False)
    key_width = 2 + max(len(str(len(table.columns))), 1)  # "#12" and its padding's share
    # how much each column narrows if its header goes: the widest gain first
    gains = sorted(((f[0] - max(c[0], key_width), i) for i, (f, c) in enumerate(zip(full, cells))), reverse=True)
    lo = [f[0] for f in full]
    chosen = []
    for gain, i in gains:
        if sum(lo) <= room or gain <= 0:
            break
        lo[i] -= gain
        chosen.append(i)
    if sum(lo) > room:
        return None
    legend = []
    for n, i in enumerate(sorted(chosen), 1):
        col = table.columns[i]
        header = col.header
        name = header.plain if isinstance(header, Text) else console.render_str(str(header)).plain
        col.header = Text(f"#{n}")
        legend.append(f"#{n}: {' '.join(name.split())}")
    widths = _widths(_ranges(console, table), room)
    assert widths is not None
    if sum(b for _, b in _ranges(console, table)) > room:
        _set_widths(table, widths)
    return Text("; ".join(legend), overflow="fold")


def _vertical(console: Console, table: Table, width: int) -> Table:
    """The table with one block per row: a ``column  value`` line per cell."""
    out = Table(title=table.title, caption=table.caption, show_header=False, box=table.box,
                title_style=table.title_style, title_justify=table.title_justify, caption_style=table.caption_style)
    out.add_column(style="bold", overflow="fold")
    out.add_column(overflow="fold")
    names = [c.header if isinstance(c.header, Text) else console.render_str(c.header) for c in table.columns]
    columns = [list(c.cells) for c in table.columns]
    last = len(columns) - 1
    for r, row in enumerate(table.rows):
        for c, cells in enumerate(columns):
            out.add_row(names[c], cells[r] if r < len(cells) else "", style=row.style,
                        end_section=c == last and r < len(table.rows) - 1)
    room = _room(out, width)
    ranges = _ranges(console, out)
    widths = _widths(ranges, room)
    if widths is None:  # a word longer than the table may be: it is folded, never cut
        head = min(ranges[0][1], max(4, room // 3))
        widths = [head, max(3, room - head)]
    _set_widths(out, widths)
    return out


def _folded(console: Console, table: Table, width: int) -> Table:
    """A table without headers to stand for (a list of quantities and values) whose
    words do not fit: its widest columns narrowed, a word too long for its column
    folded onto the next line (never cut)."""
    room = _room(table, width)
    ranges = [(min(lo, 3 + table._get_padding_width(i)), hi) for i, (lo, hi) in enumerate(_ranges(console, table))]
    widths = _widths(ranges, room) or [max(1, room // len(ranges))] * len(ranges)
    for col in table.columns:
        col.overflow = "fold"
    _set_widths(table, widths)
    return table


def fit(table: Table, console: Console) -> list[RenderableType]:
    """``table`` laid out for ``console``'s width with no cell cut: the renderables to
    print, in order (the table, and a legend line where headers were abbreviated).
    Changes ``table``'s column widths and headers; a vertical layout is a new table."""
    width = console.width
    room = _room(table, width)
    cells = [hi for _, hi in _ranges(console, table, headers=False)]
    widths = _widths(_ranges(console, table), room, cells)
    if widths is not None:
        if sum(b for _, b in _ranges(console, table)) > room:  # rich's own narrowing may cut: set them
            _set_widths(table, widths)
        out: list[RenderableType] = [table]
    elif not table.show_header or len(table.columns) < 2:
        out = [_folded(console, table, width)]
    else:
        legend = _abbreviated(console, table, width)
        out = [table, legend] if legend is not None else [_vertical(console, table, width)]
    _room_for_title(console, out[0], width)  # type: ignore[arg-type]
    return out


def _room_for_title(console: Console, table: Table, width: int) -> None:
    """Widen a table narrower than its title (up to ``width``): rich wraps a title to
    the table's width, a long one into a column of fragments."""
    if table.title is None:
        return
    title = table.title if isinstance(table.title, Text) else console.render_str(str(table.title))
    natural = sum(hi for _, hi in _ranges(console, table)) + table._extra_width
    if title.cell_len > natural:
        table.min_width = min(width, title.cell_len)


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` on ``console`` as :func:`fit` lays it out."""
    for part in fit(table, console):
        console.print(part)
