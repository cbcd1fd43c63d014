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

cdef class LiveComponents:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object _comps_list, _gathered, _order, busy_flushed, components, costs, cset, current, formed
    cdef public object free_pace, lockstep_s, log_rounds, need_finish, num_gpus_held, of_gpu, of_job, rjobs
    cdef public object sharing, shared, state, tables, vector_min_components, vector_min_finish
