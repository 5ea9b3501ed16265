"""What both views say the same way (the headless lines and the TUI): no rich, no textual."""
