"""The interactive Textual view. Imported only when the TUI is used."""
