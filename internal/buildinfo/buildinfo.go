// Package buildinfo names the build of the running binary: its version, the
// VCS revision it was built from and the Go version, for --version and the
// ingest_build_info metric.
//
// The version comes from the linker when set (go build -ldflags
// "-X github.com/fleet/ingest/internal/buildinfo.version=v1.2.3", as the
// Makefile and Dockerfile do), else from the module version Go recorded
// (runtime/debug.ReadBuildInfo), else "devel". The revision is the
// vcs.revision Go stamps into binaries built in a work tree, with "-dirty"
// when the tree had local changes, or the linker's value, else "unknown".
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set by the linker (-X); empty otherwise.
var (
	version  string
	revision string
)

// Info describes one build.
type Info struct {
	Version   string
	Revision  string
	GoVersion string
}

// Get returns the build of the running binary.
func Get() Info {
	info := Info{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		if info.Revision == "" {
			var rev string
			dirty := false
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					dirty = s.Value == "true"
				}
			}
			if len(rev) > 12 {
				rev = rev[:12]
			}
			if rev != "" && dirty {
				rev += "-dirty"
			}
			info.Revision = rev
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	if info.Revision == "" {
		info.Revision = "unknown"
	}
	return info
}

// String is the one line --version prints.
func (i Info) String() string {
	return fmt.Sprintf("%s (revision %s, %s)", i.Version, i.Revision, i.GoVersion)
}
