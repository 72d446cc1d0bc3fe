package fleet

// T is the part of testing.TB that the fleet's test-facing helpers use: they fail through
// it and register their cleanups with it. *testing.T and *testing.B satisfy it.
type T interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
	Failed() bool
}
