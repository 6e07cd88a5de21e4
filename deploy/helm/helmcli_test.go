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
// with the Helm CLI that HELM_BIN names, as a platform team would.
func TestHelmCLILint(t *testing.T) {
	bin := os.Getenv(HelmEnv)
	if bin == "" {
		t.Skipf("opt-in: set %s to a Helm 3 binary to run helm lint with the Helm CLI (make test does not install Helm; TestChartLints lints the chart through Helm's Go library)", HelmEnv)
	}
	t.Parallel()
	out, err := exec.Command(bin, "lint", "--strict", chartDir).CombinedOutput()
	require.NoError(t, err, "%s lint --strict %s:\n%s", bin, chartDir, out)
	require.Contains(t, string(out), "0 chart(s) failed")
	out, err = exec.Command(bin, "template", "fleet", chartDir).CombinedOutput()
	require.NoError(t, err, "%s template fleet %s:\n%s", bin, chartDir, out)
	require.Contains(t, string(out), "kind: Deployment")
}
