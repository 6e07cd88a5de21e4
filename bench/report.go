package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// chart is one point of a latency chart.
type chart struct {
	group         string
	x             float64
	p50, p90, p99 time.Duration
}

// loadAverage returns the machine's one-minute load average ("?" if
// unknown): the figures of a run are only as good as the machine was idle.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

func writeReport(dir string, results []Result, charts []chart, took time.Duration, loadAtStart string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "latest.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var md strings.Builder
	fmt.Fprintf(&md, "# Benchmark results\n\nWritten by `make bench` on %s (%d CPUs, %s), in %s, on a PostgreSQL cluster of its own (fsync on). Every ratio compares with a baseline measured in the same run on the same cluster; a ratio above 1 means faster than the baseline. One-minute load average of the machine at the start %s, at the end %s: figures taken while other work loads the machine are not final.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), runtime.Version(), took.Round(time.Second), loadAtStart, loadAverage())
	md.WriteString("| scenario | ours | baseline | unit | ratio | target | met | note |\n|---|---:|---:|---|---:|---|---|---|\n")
	for _, r := range results {
		met := ""
		if r.Met != nil {
			met = map[bool]string{true: "yes", false: "**no**"}[*r.Met]
		}
		fmt.Fprintf(&md, "| %s | %v | %s | %s | %s | %s | %s | %s |\n", r.Scenario, r.Ours, optional(r.Baseline), r.Unit, optional(r.Ratio), r.Target, met, r.Note)
	}
	md.WriteString("\n![enqueue→Succeeded latency, concurrency 4](latency-end-to-end.png)\n\n![enqueue→Succeeded latency, concurrency 32](latency-end-to-end-c32.png)\n\n![enqueue latency](latency-enqueue.png)\n")
	if err := os.WriteFile(filepath.Join(dir, "latest.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	for group, spec := range map[string]struct{ title, x string }{
		"end-to-end":     {"enqueue → Succeeded latency, trivial folder, --concurrency 4", "worker processes"},
		"end-to-end-c32": {"enqueue → Succeeded latency, trivial folder, --concurrency 32", "worker processes"},
		"enqueue":        {"enqueue latency (reserve + job insert, one transaction)", "concurrent clients"},
	} {
		if err := plotLatency(filepath.Join(dir, "latency-"+group+".png"), spec.title, spec.x, charts, group); err != nil {
			return err
		}
	}
	return nil
}

func optional(f *float64) string {
	if f == nil {
		return "-"
	}
	return fmt.Sprint(*f)
}

func plotLatency(path, title, xLabel string, charts []chart, group string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = "milliseconds"
	var p50, p90, p99 plotter.XYs
	for _, c := range charts {
		if c.group != group {
			continue
		}
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		p50 = append(p50, plotter.XY{X: c.x, Y: ms(c.p50)})
		p90 = append(p90, plotter.XY{X: c.x, Y: ms(c.p90)})
		p99 = append(p99, plotter.XY{X: c.x, Y: ms(c.p99)})
	}
	if err := plotutil.AddLinePoints(p, "p50", p50, "p90", p90, "p99", p99); err != nil {
		return err
	}
	p.Legend.Top = true
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}
