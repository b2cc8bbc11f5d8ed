"""TensorFlow's start-up lines, which ddlrun keeps out of the ranks' output
unless ``--verbose``.

Every rank that imports TensorFlow writes the same handful of notices to
stderr before it does anything: absl's "All log messages before
absl::InitializeLog()" line, the oneDNN notice, the CPU-feature notice (two
lines), cudart's "Could not find cuda drivers" on a machine without a GPU
driver, and, on CUDA installs, "Unable to register cuDNN/cuFFT/cuBLAS
factory" and the TF-TRT warning. With 8 ranks that is dozens of lines before
the first epoch, and none of them asks the user to do anything.

Only those lines are hidden, and only in the form TensorFlow writes them: a
log header (``I0000 00:00:... 123 port.cc:153]`` or the older
``2024-01-01 ...: I tensorflow/...:113]``) followed by one of the known
messages. Anything else passes, whatever it looks like: a user's own
warnings and errors, TensorFlow's other warnings, a "To enable the
following instructions" line that does not follow the CPU-feature notice.
cuInit's failure is hidden only on a rank that said just before that it
found no CUDA driver (then the failure says nothing new); on a machine with
a driver it is an error worth seeing, and it passes.

The first hidden line is replaced by one line saying what is hidden and
how to see it, once per ddlrun run.
"""

import re

# absl's header (I0000 00:00:1796617428.961109   17639 port.cc:153]), or TF
# 2.15's own (2024-01-01 12:00:00.000000: I tensorflow/core/util/port.cc:113]).
_HEADER = (rb"(?:[IWE]\d{4} \d+:\d+:\d+\.\d+ +\d+ "
           rb"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] )\S+:\d+\] ")
_ABSL = re.compile(rb"WARNING: All log messages before absl::InitializeLog\(\) is called are "
                   rb"written to STDERR")
_NOTICES = re.compile(_HEADER + rb"(?:"
                      rb"oneDNN custom operations are on\. .*"
                      rb"|Unable to register cu(?:DNN|FFT|BLAS) factory: Attempting to register "
                      rb"factory for plugin cu\w+ when one has already been registered"
                      rb"|TF-TRT Warning: Could not find TensorRT"
                      rb"|computation placer already registered\. .*)")
_NO_DRIVER = re.compile(_HEADER + rb"Could not find cuda drivers on your machine, GPU will not "
                                  rb"be used\.")
_CPU_FEATURES = re.compile(_HEADER + rb"This TensorFlow binary is optimized to use available CPU "
                                     rb"instructions in performance-critical operations\.")
_CPU_FEATURES_MORE = re.compile(rb"To enable the following instructions: .*, in other "
                                rb"operations, rebuild TensorFlow with the appropriate compiler "
                                rb"flags\.")
_CUINIT = re.compile(_HEADER + rb"failed call to cuInit: .*")

NOTE = (b"ddlrun: TensorFlow's start-up lines (absl, oneDNN, CPU features, no CUDA driver) "
        b"are hidden from every rank's output; ddlrun --verbose shows them\n")


class StartupLines:
    """What one ddlrun run hides: shared by all its ranks' streams (and its
    restarts), so that the note is written once. ``show`` (``--verbose``)
    hides nothing."""

    def __init__(self, show=False):
        self.show = show
        self.hidden = 0
        self.noted = False

    def stream(self):
        """A filter for one rank's stream, or None when nothing is hidden."""
        return None if self.show else StreamFilter(self)


class StreamFilter:
    """One rank's stream: TensorFlow's notices depend on the line before
    (the CPU-feature notice's second line, cuInit after "no driver")."""

    def __init__(self, run):
        self.run = run
        self.after_cpu_features = False
        self.no_driver = False

    def hides(self, text):
        """True if ``text`` (a whole line, without its newline or prefix) is
        one of TensorFlow's start-up lines."""
        text = text.rstrip(b"\r")
        follows_cpu_features, self.after_cpu_features = self.after_cpu_features, False
        if _NO_DRIVER.fullmatch(text):
            self.no_driver = True
        elif _CPU_FEATURES.fullmatch(text):
            self.after_cpu_features = True
        elif not (_ABSL.fullmatch(text) or _NOTICES.fullmatch(text)
                  or (follows_cpu_features and _CPU_FEATURES_MORE.fullmatch(text))
                  or (self.no_driver and _CUINIT.fullmatch(text))):
            return False
        self.run.hidden += 1
        return True

    def note(self):
        """The note to write in the first hidden line's place (once a run)."""
        if self.run.noted:
            return b""
        self.run.noted = True
        return NOTE
