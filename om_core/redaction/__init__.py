"""Secret redaction for everything that leaves the machine: the rules, what a value and its name say, and the identifiers memory exists to keep."""
