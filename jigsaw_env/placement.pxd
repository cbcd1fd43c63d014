# Declarations for the optional compiled build (jigsaw_env/accel.py; Cython reads this file beside
# the .py of the same name). Each class below becomes an extension type whose listed attributes are
# C fields: compiled code reads them without a dictionary lookup. The sources read the same lines
# (jigsaw_env/declared.py), so that a declared class behaves alike in both modes.
# Every name is an attribute the class sets (untyped: `object`); attributes not listed still work
# through the instance dict (`__dict__`), as do class-level defaults. The Python source is unchanged
# and stays the reference: tests/sim/test_accel.py holds both modes to the same results.

cimport cython

# GpuLedger is also typed where its scalar loops run: its per-GPU lists are lists (a ledger made
# from Python holds lists there: copies share _cl, the others are its own), and check/add/
# add_alone/remove/peak_list are cpdef methods (still overridable by a Python subclass) whose
# GPU indices are C integers; memory stays Python floats, added in the same order.
cdef class PeakEntry:  # GpuLedger.peak_list's memo entry
    cdef public object decision, job, peaks

cdef class GpuLedger:
    cdef dict __dict__
    cdef object __weakref__
    cdef public object state, capacity, decision, _mem, _workers, _views_ro
    cdef public list _ml, _wl, _cl, _wc
    cdef public dict _pk

    @cython.locals(e=PeakEntry)
    cpdef list peak_list(self, job, jd)

    @cython.locals(gpus=tuple, n=cython.Py_ssize_t, workers=list, mem=list, capacity=list, g=cython.Py_ssize_t,
                   cap_w=cython.Py_ssize_t)
    cpdef check(self, job_id, jd, _chosen=*)

    @cython.locals(wl=list, ml=list, wc=list, g=cython.Py_ssize_t, w=cython.Py_ssize_t)
    cpdef add(self, job_id, jd, checked=*)

    @cython.locals(gpus=tuple, wl=list, ml=list, wc=list, n=cython.Py_ssize_t, g=cython.Py_ssize_t)
    cpdef add_alone(self, job_id, jd)

    @cython.locals(wl=list, ml=list, wc=list, g=cython.Py_ssize_t, w=cython.Py_ssize_t)
    cpdef remove(self, job_id)
