"""Rank program: print escape sequences, carriage-return progress bars and markup-like text."""

import sys

sys.stdout.write("\x1b[31mred\x1b[0m plain\n")
sys.stdout.write("progress 10%\rprogress 50%\rprogress 100%\n")
sys.stdout.write("[bold]not bold[/] [rank0] [/]\n")
sys.stdout.write("\x1b]0;title\x07osc gone\n")
sys.stdout.write("tab\there\x00nul\n")
sys.stdout.flush()
