// Preloaded (LD_PRELOAD) into the MPI tests of the ASan build by scripts/sanitize: makes
// dlclose() a no-op, so the Open MPI components that MPI_Init dlopen()s stay mapped until
// the process exits. LeakSanitizer runs at exit; without this, the one-time allocations of
// components already unloaded by MPI_Finalize have "<unknown module>" stacks, which no
// suppression can match (see lsan.supp). Nothing else changes: memory is not freed anyway
// when a process ends.
extern "C" int dlclose(void*) { return 0; }
