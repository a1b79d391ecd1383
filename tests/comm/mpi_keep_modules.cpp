// Linked into the mpi test executables: Open MPI unloads its components (dlclose) in
// MPI_Finalize, before LeakSanitizer reports at exit, so the leaks Open MPI leaves behind would
// show stacks of "<unknown module>" that no suppression can name. Keeping every library loaded
// lets .ci/lsan-mpi.supp name Open MPI's modules (mca_*.so), and our own leaks still show.
extern "C" int dlclose(void*) { return 0; }
