"""The values some wire fields take: finish reasons, error kinds and constraint kinds. Declared
here and read through shared/messages.py, as every service does."""

from __future__ import annotations

__all__ = [
    "CONSTRAINT_CHOICE",
    "CONSTRAINT_GRAMMAR",
    "CONSTRAINT_JSON_OBJECT",
    "CONSTRAINT_JSON_SCHEMA",
    "CONSTRAINT_KINDS",
    "CONSTRAINT_REGEX",
    "ERROR_KINDS",
    "ERR_DEADLINE",
    "ERR_FAILED",
    "ERR_INVALID",
    "ERR_OVERLOADED",
    "ERR_TOO_LARGE",
    "FINISH_ABORT",
    "FINISH_ERROR",
    "FINISH_LENGTH",
    "FINISH_REASONS",
    "FINISH_STOP",
]

# finish reasons shared by every stage; "" means still running
FINISH_STOP = "stop"  # EOS, a stop token or a stop string
FINISH_LENGTH = "length"  # max_new_tokens or the context limit
FINISH_ABORT = "abort"  # the client went away or asked to stop
FINISH_ERROR = "error"  # the pipeline failed the request; TokenItem.error says why
FINISH_REASONS = ("", FINISH_STOP, FINISH_LENGTH, FINISH_ABORT, FINISH_ERROR)

# what kind of error ended a request (finish_reason "error"), so a front end can pick the status
ERR_FAILED = "failed"  # the pipeline failed it (a worker died, ...): 500
ERR_OVERLOADED = "overloaded"  # the queue is full: 503 with Retry-After
ERR_TOO_LARGE = "too_large"  # no worker group could ever hold it: 400
ERR_DEADLINE = "deadline"  # it outlived its deadline: 504
ERR_INVALID = "invalid"  # the worker cannot do what it asks (a grammar that does not compile): 400
ERROR_KINDS = ("", ERR_FAILED, ERR_OVERLOADED, ERR_TOO_LARGE, ERR_DEADLINE, ERR_INVALID)

# what a Constraint's text is (services/worker/grammar.py compiles each)
CONSTRAINT_JSON_SCHEMA = "json_schema"  # a JSON schema, as JSON text
CONSTRAINT_JSON_OBJECT = "json_object"  # any JSON object; text unused
CONSTRAINT_REGEX = "regex"  # a regular expression the whole output matches
CONSTRAINT_CHOICE = "choice"  # a JSON array of strings: the output is one of them
CONSTRAINT_GRAMMAR = "grammar"  # an EBNF grammar (xgrammar's dialect of GBNF) with a root rule
CONSTRAINT_KINDS = (
    CONSTRAINT_JSON_SCHEMA,
    CONSTRAINT_JSON_OBJECT,
    CONSTRAINT_REGEX,
    CONSTRAINT_CHOICE,
    CONSTRAINT_GRAMMAR,
)
