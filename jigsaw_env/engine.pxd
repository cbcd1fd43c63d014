# Declarations for the optional compiled build (jigsaw_env/accel.py; Cython reads this file beside
# the .py of the same name). Each class below becomes an extension type whose listed attributes are
# C fields: compiled code reads them without a dictionary lookup. The sources read the same lines
# (jigsaw_env/declared.py), so that a declared class behaves alike in both modes.
# Every name is an attribute the class sets (untyped: `object`); attributes not listed still work
# through the instance dict (`__dict__`), as do class-level defaults. The Python source is unchanged
# and stays the reference: tests/sim/test_accel.py holds both modes to the same results.

cdef class Member:  # a dataclass: its fields only (no __dict__), as a slotted dataclass
    cdef public object job_id, profile, gpus, iteration0, iso_s, slot

cdef class Component:
    cdef dict __dict__  # (cached_property and the class-level default of seq need it)
    cdef object __weakref__
    cdef public object H, _cum_bytes_l, _cum_l, _cum_loads_l, _cum_tot, _eps, _loads_l, _phase_bytes_l, _step_l
    cdef public object cycle, finish, formed_s, gpu_list, k, loads, members, partial, ready_s, slot
    cdef public object alloc_gpus, group, group_key, busy_rate, busy_rate_sum

cdef class ComponentSet:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object _cap, _free, _pending, _pool, _pool_used, _width, comps
    # the per-slot arrays (ComponentSet._INT, _FLOAT, and cum, ct)
    cdef public object H, k, ncol, off, cycle, eps, ready, partial, ctH, prev, fin, rsum, cum, ct
