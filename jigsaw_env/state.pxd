# Declarations for the optional compiled build (jigsaw_env/accel.py; Cython reads this file beside
# the .py of the same name). Each class below becomes an extension type whose listed attributes are
# C fields: compiled code reads them without a dictionary lookup. The sources read the same lines
# (jigsaw_env/declared.py), so that a declared class behaves alike in both modes.
# Every name is an attribute the class sets (untyped: `object`); attributes not listed still work
# through the instance dict (`__dict__`), as do class-level defaults. The Python source is unchanged
# and stays the reference: tests/sim/test_accel.py holds both modes to the same results.

# dataclasses: their fields only (no __dict__, no weak references), as slotted dataclasses
cdef class JobState:
    cdef public object job_id, arrival_s, num_gpus, model, batch_size, iterations, duration_s, status
    cdef public object progress, iteration, attained_gpu_s, run_s, first_start_s, finish_s, placement, level
    cdef public object pattern, restart_until_s, preemptions, migrations, level_changes, last_round_run
    cdef public object status_since_s, last_run_s

cdef class ClusterState:
    cdef public object cluster, costs, time_s, round, jobs, active_ids, max_workers_per_gpu, running_ref
    cdef public object arrival_pos, in_force, shared_ref, sharing

cdef class CostModel:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object _iso, _largest_peaks, _peak_fast, _peak_lists, _peaks, _profiles, cluster, eta_override, eta_scale
    cdef public object free_running, homogeneous, spb, step_tables
