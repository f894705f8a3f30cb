package config

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the variable tables of docs/configuration.md from the declarations")

var docsPath = filepath.Join("..", "..", "docs", "configuration.md")

const (
	docsBegin = "<!-- vars:begin -->\n"
	docsEnd   = "<!-- vars:end -->"
)

// splice returns doc with what lies between its markers replaced by tables.
func splice(doc, tables string) (string, error) {
	begin := strings.Index(doc, docsBegin)
	end := strings.Index(doc, docsEnd)
	if begin < 0 || end < begin {
		return "", fmt.Errorf("no %q ... %q markers", strings.TrimSpace(docsBegin), docsEnd)
	}
	return doc[:begin+len(docsBegin)] + "\n" + tables + "\n" + doc[end:], nil
}

func TestConfigurationDocsListEveryVariableAsDeclared(t *testing.T) {
	t.Parallel()
	var tables bytes.Buffer
	if err := WriteMarkdown(&tables); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	want, err := splice(string(doc), tables.String())
	if err != nil {
		t.Fatalf("%s: %v", docsPath, err)
	}
	if *update {
		if err := os.WriteFile(docsPath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if want != string(doc) {
		t.Errorf("%s differs from the declarations in vars.go (- the docs, + the declarations):\n%s\nRegenerate it: go test ./internal/config -run TestConfigurationDocs -update",
			docsPath, lineDiff(string(doc), want))
	}
}

// lineDiff lists the lines only in a (-) and only in b (+), in order, from their
// longest common subsequence.
func lineDiff(a, b string) string {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out strings.Builder
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			i, j = i+1, j+1
		case j < len(y) && (i == len(x) || lcs[i][j+1] >= lcs[i+1][j]):
			fmt.Fprintf(&out, "+ %s\n", y[j])
			j++
		default:
			fmt.Fprintf(&out, "- %s\n", x[i])
			i++
		}
	}
	return out.String()
}

func TestLineDiffShowsWhatChanged(t *testing.T) {
	t.Parallel()
	got := lineDiff("a\nb\nc", "a\nB\nc\nd")
	if got != "+ B\n- b\n+ d\n" && got != "- b\n+ B\n+ d\n" {
		t.Errorf("lineDiff = %q", got)
	}
}
