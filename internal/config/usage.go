package config

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// WriteEnv writes every variable as an env file, by group: its help as a comment, then
// NAME=default. A variable without a default is written commented out, after what
// leaving it unset means; a required one is written empty. It is what `space-api
// config` prints.
func WriteEnv(w io.Writer) error {
	b := bufio.NewWriter(w)
	fmt.Fprintln(b, "# The environment variables of space-api and their defaults (space-api config).")
	last := ""
	for _, v := range Vars() {
		if v.Group != last {
			fmt.Fprintf(b, "\n## %s\n", v.Group)
			last = v.Group
		}
		fmt.Fprintf(b, "\n# %s\n", v.Help)
		switch {
		case v.Default != "":
			fmt.Fprintf(b, "%s=%s\n", v.Name, v.Default)
		case v.Required != "":
			fmt.Fprintf(b, "# Required: %s.\n%s=\n", v.Required, v.Name)
		default:
			fmt.Fprintf(b, "# Unset: %s.\n#%s=\n", v.unset(), v.Name)
		}
	}
	return b.Flush()
}

// WriteMarkdown writes the tables of docs/configuration.md, one per group: each
// variable, its default and its help. It is what `space-api config --markdown`
// prints, and a test holds the docs to it.
func WriteMarkdown(w io.Writer) error {
	b := bufio.NewWriter(w)
	last := ""
	for _, v := range Vars() {
		if v.Group != last {
			if last != "" {
				fmt.Fprintln(b)
			}
			fmt.Fprintf(b, "### %s\n\n| Variable | Default | Meaning |\n|---|---|---|\n", v.Group)
			last = v.Group
		}
		def := "`" + v.Default + "`"
		switch {
		case v.Default != "":
		case v.Required != "":
			def = "required"
		default:
			def = v.unset()
		}
		fmt.Fprintf(b, "| `%s` | %s | %s |\n", v.Name, cell(def), cell(v.Help))
	}
	return b.Flush()
}

// unset is what an unset variable without a default means.
func (v Var) unset() string {
	if v.Unset == "" {
		return "unset"
	}
	return v.Unset
}

// cell escapes what would end a table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
