package flags

import (
	"errors"
	"fmt"
)

// ErrMalformed marks a flag value that cannot be used as a whole: the quota flag is not
// an object, one of its sections has the wrong type, a client entry is not an object,
// a pool target is incomplete. Test for it with errors.Is. A malformed rate entry is not
// an ErrMalformed error of the flag: it is reported in RateEntry.Malformed (which wraps
// ErrMalformed too) and only its key falls back to the env rate.
var ErrMalformed = errors.New("malformed flag value")

// ErrTargeting marks a flag definition with targeting rules.
// The file provider serves static defaultVariant values only: a rule it silently
// ignored would hand every client the default variant while the operator believes the
// rule is in force, so the file is refused instead.
var ErrTargeting = errors.New("targeting rules are not supported: the flags file serves static defaultVariant values only")

// FlagError is a problem with one flag of a flags file. Flag names the flag so that the
// operator knows where to look; Variant names the variant when the problem is in one
// variant's value.
type FlagError struct {
	Flag    string
	Variant string
	Err     error
}

func (e *FlagError) Error() string {
	if e.Variant != "" {
		return fmt.Sprintf("flag %q, variant %q: %v", e.Flag, e.Variant, e.Err)
	}
	return fmt.Sprintf("flag %q: %v", e.Flag, e.Err)
}

func (e *FlagError) Unwrap() error { return e.Err }

// malformedf returns an ErrMalformed error with a formatted explanation.
func malformedf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}
