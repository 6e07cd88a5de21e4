package cli

import (
	"regexp"
	"strings"

	"github.com/alecthomas/kong"
)

// FlagDoc is one flag a command line accepts, as documentation must name
// it.
type FlagDoc struct {
	// Command is the command path ("" for the binary's global flags,
	// "serve", "worker run" …).
	Command string
	Name    string
	Envs    []string
}

// Flags lists every flag of grammar that --help shows (hidden flags are
// left out), command by command, for tests that hold the README to the
// binaries.
func Flags(grammar any, name string) ([]FlagDoc, error) {
	parser, err := kong.New(grammar, kong.Name(name), kong.Vars{"version": name})
	if err != nil {
		return nil, err
	}
	var out []FlagDoc
	var walk func(n *kong.Node, path []string)
	walk = func(n *kong.Node, path []string) {
		for _, f := range n.Flags {
			if f.Hidden || f.Name == "help" {
				continue
			}
			out = append(out, FlagDoc{Command: strings.Join(path, " "), Name: f.Name, Envs: f.Envs})
		}
		for _, c := range n.Children {
			if c.Hidden {
				continue
			}
			walk(c, append(append([]string(nil), path...), c.Name))
		}
	}
	walk(parser.Model.Node, nil)
	return out, nil
}

// NamesFlag reports whether text names the flag --name as a whole word
// (not as part of a longer flag).
func NamesFlag(text, name string) bool {
	return regexp.MustCompile(`(^|[^\w-])--` + regexp.QuoteMeta(name) + `([^\w-]|$)`).MatchString(text)
}
