package helm_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// HelmEnv names a Helm 3 CLI binary. make test does not install Helm
// (building it takes minutes), so TestHelmCLILint is opt-in: it runs only
// with HELM_BIN set, and then a Helm that cannot lint the chart fails it.
// Without it the chart is still linted, through Helm's Go library
// (TestChartLints).
const HelmEnv = "HELM_BIN"

// TestHelmCLILint runs helm lint --strict and helm template on the chart
// with the Helm CLI that HELM_BIN names, as a platform team would, with the
// one value the chart requires (uploads.buckets).
func TestHelmCLILint(t *testing.T) {
	bin := os.Getenv(HelmEnv)
	if bin == "" {
		t.Skipf("opt-in: set %s to a Helm 3 binary to run helm lint with the Helm CLI (make test does not install Helm; TestChartLints lints the chart through Helm's Go library)", HelmEnv)
	}
	t.Parallel()
	set := []string{"--set", "uploads.buckets={fleet-uploads}"}
	out, err := exec.Command(bin, append([]string{"lint", "--strict", chartDir}, set...)...).CombinedOutput()
	require.NoError(t, err, "%s lint --strict %s:\n%s", bin, chartDir, out)
	require.Contains(t, string(out), "1 chart(s) linted, 0 chart(s) failed")
	for _, bad := range []string{"[ERROR]", "[WARNING]", "Fail:"} {
		require.NotContains(t, string(out), bad)
	}
	out, err = exec.Command(bin, append([]string{"template", "fleet", chartDir}, set...)...).CombinedOutput()
	require.NoError(t, err, "%s template fleet %s:\n%s", bin, chartDir, out)
	require.Contains(t, string(out), "kind: Deployment")
}
