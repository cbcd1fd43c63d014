# Declarations for the optional compiled build (jigsaw_env/accel.py; Cython reads this file beside
# the .py of the same name). Each class below becomes an extension type whose listed attributes are
# C fields: compiled code reads them without a dictionary lookup. The sources read the same lines
# (jigsaw_env/declared.py), so that a declared class behaves alike in both modes.
# Every name is an attribute the class sets (untyped: `object`); attributes not listed still work
# through the instance dict (`__dict__`), as do class-level defaults. The Python source is unchanged
# and stays the reference: tests/sim/test_accel.py holds both modes to the same results.

cdef class Simulator:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object _alloc_total, _busy_total, _defer_round_end, _in_force, _initial_jobs, _levels, _pending
    cdef public object _pending_pos, _round_token, _sharing, _useful_total
    cdef public object cluster, config, costs, first_arrival_s, live, log, num_finished, quiet_rounds, started_at
    cdef public object state, truncated, useful_at_window_end, window_end_s
