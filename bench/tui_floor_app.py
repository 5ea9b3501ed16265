"""First-frame floor for bench/tui.py: the smallest Textual app that shows a rank table.

Python startup + ``import textual`` + one DataTable with the columns "rank" and "state" and a
"starting" row: what any Textual view of a run pays before its first frame.
"""

from textual.app import App, ComposeResult
from textual.widgets import DataTable


class Floor(App[None]):
    def compose(self) -> ComposeResult:
        yield DataTable()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("rank", "state")
        table.add_row("0", "starting")


if __name__ == "__main__":
    Floor().run()
