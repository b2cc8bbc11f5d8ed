"""How ddlrun writes one rank's output stream: whole lines, each with the
rank's prefix, and progress bars that stay readable.

Keras redraws its progress bar in place: each update is backspaces, a
carriage return and the whole bar again (ANSI colour codes included), and
only the epoch's last update ends with a newline. It does so even when
stdout is a pipe, as it is under ddlrun. Cut into lines at newlines only,
an epoch's hundreds of redraws became one huge ``[0] ...`` line. So:

* Into a file or a pipe (``screen`` is None), a redrawn line is written once,
  when it ends, in its final state: the text after its last carriage
  return (Keras pads each redraw to cover the previous one, so that text is
  the whole bar). A log keeps one line per epoch, as with ``verbose=2``.
* On a terminal (a ``Screen``), a redrawn line is drawn as it changes: a
  carriage return, the prefix, the current text and "erase to the end of the
  line", so the bar moves in place with its ``[rank]`` in front. Plain
  lines are still written whole. If another rank writes while a bar is on
  the screen, the bar's line is ended first (it stays in its last state)
  and the bar continues on a new line at its next redraw.

Escape sequences and UTF-8 characters split between two reads are never
drawn half: the drawn text stops before them until the rest arrives.

A plain line that ``hide`` (a startup_lines.StreamFilter) recognises as one
of TensorFlow's start-up lines is not written; the first such line of a run
is replaced by ddlrun's note saying so.
"""

import os
import re

MAX_LINE = 1 << 20  # a longer run without a newline is written as it is
ERASE_TO_END = b"\x1b[K"
_BACKSPACES_AT_END = re.compile(rb"\x08+$")
_UNFINISHED_ESCAPE = re.compile(rb"\x1b(\[[0-?]*[ -/]*)?$")


class Screen:
    """A terminal shared by several streams: whose redrawn line, if any, the
    cursor is on."""

    def __init__(self):
        self.owner = None


def screens_for(stdout_fd, stderr_fd):
    """{"stdout": Screen or None, "stderr": ...}: a Screen for each fd that
    is a terminal, one shared Screen when both are (the same terminal)."""
    out_tty, err_tty = os.isatty(stdout_fd), os.isatty(stderr_fd)
    shared = Screen() if out_tty and err_tty else None
    return {"stdout": shared or (Screen() if out_tty else None),
            "stderr": shared or (Screen() if err_tty else None)}


def _drawable(text):
    """``text`` without an escape sequence or UTF-8 character cut off at its
    end (the rest is in the next read)."""
    text = _UNFINISHED_ESCAPE.sub(b"", text)
    for back in range(1, min(4, len(text)) + 1):
        byte = text[-back]
        if byte < 0x80:
            return text
        if byte >= 0xC0:  # a lead byte: is its character complete?
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return text if back >= needed else text[:-back]
    return text


class RankOutput:
    """Turns the bytes one rank writes to one stream into what ddlrun writes.

    Args:
        prefix: Bytes put in front of every line (``b"[3] "``, or empty).
        screen: The ``Screen`` when the output is a terminal, None when it is
            a file or a pipe.
        hide: A startup_lines.StreamFilter, or None to write every line.
    """

    def __init__(self, prefix=b"", screen=None, hide=None):
        self.prefix = prefix
        self.screen = screen
        self.hide = hide
        self.shown = b""            # the last complete redraw of this line
        self.current = bytearray()  # the text after the line's last carriage return
        self.redrawn = False        # the line has had a carriage return

    def feed(self, data):
        """Bytes to write now for ``data`` (a read of any size)."""
        out = bytearray()
        pieces = data.split(b"\n")
        for piece in pieces[:-1]:
            self._add(piece)
            out += self._end_line()
        self._add(pieces[-1])
        if len(self.current) >= MAX_LINE:
            out += self._end_line()
        elif self.redrawn and self.screen is not None:
            out += self._draw()
        return bytes(out)

    def rest(self):
        """What is left after the stream ended, as a line of its own."""
        if self.current or self.shown:
            return self._end_line()
        return b""

    # -- the current line ------------------------------------------------

    def _add(self, piece):
        segments = piece.split(b"\r")
        for segment in segments[:-1]:
            self.current += segment
            # Keras moves back over its previous bar (backspaces), then
            # returns the carriage: the backspaces are not part of the text.
            done = _BACKSPACES_AT_END.sub(b"", bytes(self.current))
            if done:
                self.shown = done
            self.current = bytearray()
            self.redrawn = True
        self.current += segments[-1]

    def _visible(self):
        if not self.redrawn:
            return bytes(self.current)
        # Backspaces still waiting for their carriage return (the next read).
        text = _BACKSPACES_AT_END.sub(b"", bytes(self.current))
        return text or self.shown

    def _take_screen(self):
        """What to write before drawing on the terminal: end another
        stream's redrawn line, so this one starts on a line of its own."""
        if self.screen.owner is self:
            return b"\r"
        out = b"\n" if self.screen.owner is not None else b""
        self.screen.owner = self
        return out

    def _draw(self):
        return self._take_screen() + self.prefix + _drawable(self._visible()) + ERASE_TO_END

    def _end_line(self):
        text = self._visible()
        if self.hide is not None and not self.redrawn and self.hide.hides(text):
            return self._hidden()
        if self.screen is None:
            out = self.prefix + text + b"\n"
        elif self.redrawn:
            out = self._take_screen() + self.prefix + text + ERASE_TO_END + b"\n"
            self.screen.owner = None
        else:
            owner = self.screen.owner
            out = (b"\n" if owner is not None and owner is not self else b"") + \
                self.prefix + text + b"\n"
            self.screen.owner = None
        self.shown, self.current, self.redrawn = b"", bytearray(), False
        return out

    def _hidden(self):
        """What to write for a hidden line: nothing, or (the first time in
        the run) the note, on a line of its own."""
        self.shown, self.current = b"", bytearray()
        note = self.hide.note()
        if note and self.screen is not None and self.screen.owner is not None:
            note = b"\n" + note  # another stream's bar is on this line: end it
            self.screen.owner = None
        return note
