"""Bad MPICOLL_* values raise ValueError naming the variable (issue 9, defect 4): when parsed
(``mpicoll.settings.get``) and when a collective first needs them, on one process. (Under MPI,
on every rank and before any communication: tests/mpi/test_one_rank.py.)"""

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import select, settings
from mpicoll.testing import environment

BAD = [
    ("MPICOLL_TUNING", "/nonexistent.json", r"MPICOLL_TUNING=/nonexistent.json: no such file"),
    ("MPICOLL_PROFILE", "/nonexistent.json", r"MPICOLL_PROFILE=/nonexistent.json: no such file"),
    ("MPICOLL_KERNELS", "foo", r"MPICOLL_KERNELS must be 'numba' or 'numpy', got 'foo'"),
    ("MPICOLL_RANKS_PER_NODE", "0", r"MPICOLL_RANKS_PER_NODE must be a positive integer, "
                                    r"got '0'"),
    ("MPICOLL_RANKS_PER_NODE", "abc", r"MPICOLL_RANKS_PER_NODE must be a positive integer, "
                                      r"got 'abc'"),
    ("MPICOLL_RANKS_PER_NODE", "-2", r"MPICOLL_RANKS_PER_NODE must be a positive integer"),
    ("MPICOLL_RANKS_PER_NODE", "1.5", r"MPICOLL_RANKS_PER_NODE must be a positive integer"),
    ("MPICOLL_SHORT_MSG", "8Q", r"MPICOLL_SHORT_MSG must be a number of bytes .*got '8Q'"),
    ("MPICOLL_TIMEOUT", "abc", r"MPICOLL_TIMEOUT must be a number of seconds > 0, or 0 or inf "
                               r"for no timeout, got 'abc' \(a unit may follow the number: 10m, "
                               r"1h, 500ms\)"),
    ("MPICOLL_TIMEOUT", "-1", r"MPICOLL_TIMEOUT must be a number of seconds .*got -1.0"),
    ("MPICOLL_TIMEOUT", "10x", r"MPICOLL_TIMEOUT must be a number of seconds .*got '10x'"),
    ("MPICOLL_ON_TIMEOUT", "kill", r"MPICOLL_ON_TIMEOUT must be 'exception' or 'abort'"),
    ("MPICOLL_VALIDATE", "yes", r"MPICOLL_VALIDATE must be 0 or 1, got 'yes'"),
    ("MPICOLL_HIER_OUTER", "ring;rm", r"MPICOLL_HIER_OUTER must name an algorithm"),
]


@pytest.mark.parametrize("variable, value, match", BAD)
def test_parse_names_the_variable(variable, value, match):
    with environment(**{variable: value}):
        with pytest.raises(ValueError, match=match):
            settings.get(variable)
        with pytest.raises(ValueError, match=match):      # a failure is not cached
            settings.get(variable)
    settings.get(variable)                                # restored and read again


# variable, value, an all-reduce algorithm that needs it
NEEDED_BY = {"MPICOLL_TUNING": "auto", "MPICOLL_PROFILE": "auto", "MPICOLL_SHORT_MSG": "auto",
             "MPICOLL_KERNELS": "ring", "MPICOLL_RANKS_PER_NODE": "hierarchical",
             "MPICOLL_TIMEOUT": "ring", "MPICOLL_ON_TIMEOUT": "ring", "MPICOLL_VALIDATE": "ring",
             "MPICOLL_HIER_OUTER": "hierarchical"}


@pytest.mark.parametrize("variable, value, match", BAD)
def test_collective_that_needs_it_raises(variable, value, match):
    """Through the API, on COMM_SELF: the call that needs the variable raises its error (a
    one-rank call communicates nothing, so this is the parse reaching the user)."""
    with environment(**{variable: value}):
        with pytest.raises(ValueError, match=match):
            mpicoll.allreduce(np.ones(4), algorithm=NEEDED_BY[variable], comm=MPI.COMM_SELF)


def test_kernels_variable_also_reaches_the_other_reductions():
    with environment(MPICOLL_KERNELS="foo"):
        with pytest.raises(ValueError, match="MPICOLL_KERNELS"):
            mpicoll.reduce_scatter_block(np.ones(4), algorithm="ring", comm=MPI.COMM_SELF)
        # neither reduces: the kernels are not needed
        mpicoll.allgather(np.ones(4), algorithm="ring", comm=MPI.COMM_SELF)
        mpicoll.bcast(np.ones(4), algorithm="binomial", comm=MPI.COMM_SELF)


def test_bad_tuning_file_is_an_error_not_a_silent_fallback(tmp_path):
    """A tuning file that exists but is not a decision table raises naming it -- it neither is
    ignored nor disables the shipped table."""
    bad = tmp_path / "tuning.json"
    bad.write_text("[1, 2")
    with environment(MPICOLL_TUNING=str(bad)):
        with pytest.raises(ValueError, match=rf"MPICOLL_TUNING={bad}: not a decision table"):
            select.choose("allreduce", 1024, 4, 128)
    with environment(MPICOLL_TUNING=None):
        assert settings.get("MPICOLL_TUNING") == select.DEFAULT_TUNING
        assert select.choose("allreduce", 1024, 4, 128) in mpicoll.ALGORITHMS


@pytest.mark.parametrize("variable, value, parsed", [
    ("MPICOLL_TIMEOUT", "10m", 600.0), ("MPICOLL_TIMEOUT", "1.5h", 5400.0),
    ("MPICOLL_TIMEOUT", "500ms", 0.5), ("MPICOLL_TIMEOUT", "90", 90.0),
    ("MPICOLL_TIMEOUT", "inf", None), ("MPICOLL_TIMEOUT", "0", None),
    ("MPICOLL_SEGMENT_BYTES", "1M", 1 << 20), ("MPICOLL_SEGMENT_BYTES", "0", 0),
    ("MPICOLL_SHORT_MSG", "8K", 8192), ("MPICOLL_SHORT_MSG", "4MB", 4 << 20),
    ("MPICOLL_SHORT_MSG", "1.5K", 1536),
])
def test_environment_takes_the_command_lines_suffixes(variable, value, parsed):
    """Sizes as -b/-e take them (K/M/G, powers of 1024); times as bench --timeout does."""
    from mpicoll.tools.sizes import parse_size
    with environment(**{variable: value}):
        assert settings.get(variable) == parsed
    if variable != "MPICOLL_TIMEOUT":
        assert parse_size(value) == parsed          # the same rule on the command line


def test_bad_byte_count_with_a_fraction_is_refused():
    with environment(MPICOLL_SEGMENT_BYTES="1.5"):
        with pytest.raises(ValueError, match=r"MPICOLL_SEGMENT_BYTES must be a number of bytes "
                                             r"\(an integer >= 0, or with a suffix"):
            settings.get("MPICOLL_SEGMENT_BYTES")


def test_unknown_name_warns_naming_the_closest_known_one(capsys):
    with environment(MPICOLL_TIMOUT="10", MPICOLL_SEGMENT_BYTE="1M", MPICOLL_ZZZZ="1"):
        settings.get("MPICOLL_TIMEOUT")
        err = capsys.readouterr().err
        settings.get("MPICOLL_VALIDATE")                  # once, not at every read
        assert capsys.readouterr().err == ""
    assert ("mpicoll: warning: MPICOLL_TIMOUT is not an mpicoll setting, ignored; did you mean "
            "MPICOLL_TIMEOUT?") in err
    assert "MPICOLL_SEGMENT_BYTE is not an mpicoll setting, ignored; did you mean " \
        "MPICOLL_SEGMENT_BYTES?" in err
    assert ("MPICOLL_ZZZZ is not an mpicoll setting, ignored (docs/reference/settings.md lists "
            "them)") in err
    assert settings.unknown_names({"MPICOLL_TIMEOUT": "1", "PATH": "x"}) == []
