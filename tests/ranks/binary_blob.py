"""Bytes that are no text: every byte value, invalid UTF-8, NUL, ESC sequences (a screen clear,
an OSC 52 clipboard write), a C1 CSI, a lone surrogate's UTF-8 bytes."""

BLOB = bytes(range(256)) + b"\n\xff\xfe\x00\x1b[2J\x1b]52;c;aGk=\x07\x9b31m\xed\xa0\x80end\n"
