# Declarations for the optional compiled build (jigsaw_env/accel.py; Cython reads this file beside
# the .py of the same name). Each class below becomes an extension type whose listed attributes are
# C fields: compiled code reads them without a dictionary lookup. The sources read the same lines
# (jigsaw_env/declared.py), so that a declared class behaves alike in both modes.
# Every name is an attribute the class sets (untyped: `object`); attributes not listed still work
# through the instance dict (`__dict__`), as do class-level defaults. The Python source is unchanged
# and stays the reference: tests/sim/test_accel.py holds both modes to the same results.

cdef class RunningJobs:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object _cap, _free, _pending, jobs
    # the per-row arrays (RunningJobs._FIELDS and iteration)
    cdef public object progress, iterations, eta, iso, ngpus, run_s, attained, comp, iteration

cdef class Simulator:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object _alloc_total, _busy_flushed, _busy_total, _comp_of, _components
    cdef public object _comps_list, _cset, _current, _defer_round_end, _formed, _gathered, _gpu_comp
    cdef public object _in_force, _initial_jobs, _levels, _n_live_gpus, _need_finish, _order, _pending
    cdef public object _pending_pos, _rjobs, _round_token, _sharing, _shared, _tables, _useful_total
    cdef public object cluster, config, costs, first_arrival_s, log, num_finished, quiet_rounds, started_at, state
    cdef public object truncated
    cdef public object useful_at_window_end, window_end_s
