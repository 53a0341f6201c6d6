// Package pattern owns the compiled form of the identifier rules both
// sides check (secret, volume, user and cgroup names, ids, digests): an
// anchored regular expression without counted repetition plus a length
// range, shown to users as the equivalent counted pattern.
//
// Go's regexp compiles a counted repetition by copying its operand:
// `[a-z0-9_.-]{0,62}` is a program 63 times the size of `[a-z0-9_.-]*`,
// ≈ 26 KB live for the life of the process, `{0,127}` ≈ 52 KB. The agent
// had fourteen such rules; with them the heap its package inits allocate
// halved, 2.07 → 1.06 MB (docs/performance.md, "Agent idle RSS and CPU").
// A length check costs nothing and says the same. The control plane's own
// rules (internal/cp) still use regexp: one process, no memory target.
package pattern

import (
	"fmt"
	"math/rand/v2"
	"regexp"
)

// Pattern matches a whole string against a regular expression and a
// length range in bytes.
type Pattern struct {
	re       *regexp.Regexp
	min, max int
	doc      string
}

// Must compiles compact (which must be anchored with ^ and $ and should
// have no large counted repetition) and bounds the length of a match to
// [min, max] bytes; doc is the rule as users see it, normally the counted
// form the two together are equivalent to. It panics on a bad expression
// or range, like regexp.MustCompile, so use it for package-level rules.
func Must(doc, compact string, min, max int) Pattern {
	if min < 0 || max < min {
		panic(fmt.Sprintf("pattern %s: length range [%d, %d]", doc, min, max))
	}
	return Pattern{re: regexp.MustCompile(compact), min: min, max: max, doc: doc}
}

// MatchString reports whether s follows the rule.
func (p Pattern) MatchString(s string) bool {
	return len(s) >= p.min && len(s) <= p.max && p.re.MatchString(s)
}

// String is the rule as users see it (doc).
func (p Pattern) String() string { return p.doc }

// Check compares p with its doc form compiled as a regular expression,
// and returns the first string they disagree on. The strings are prefix
// followed by characters drawn from valid, of every total length up to
// max+2 (several of each), and each of those with its first, its last and
// one middle character replaced by every character of valid and invalid
// (where rules differ most). Tests call it for each rule.
func Check(p Pattern, prefix, valid, invalid string, seed uint64) error {
	want, err := regexp.Compile(p.doc)
	if err != nil {
		return fmt.Errorf("pattern %s: doc form: %w", p.doc, err)
	}
	rnd := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	try := func(s string) error {
		if got, w := p.MatchString(s), want.MatchString(s); got != w {
			return fmt.Errorf("pattern %s: %q: compact form says %v, doc form %v", p.doc, s, got, w)
		}
		return nil
	}
	all := valid + invalid
	for n := 0; n <= p.max+2-len(prefix); n++ {
		for range 20 {
			b := []byte(prefix)
			for range n {
				b = append(b, valid[rnd.IntN(len(valid))])
			}
			if err := try(string(b)); err != nil {
				return err
			}
			if n == 0 {
				continue
			}
			for _, at := range []int{len(prefix), len(b) - 1, len(prefix) + rnd.IntN(n)} {
				orig := b[at]
				for i := range len(all) {
					b[at] = all[i]
					if err := try(string(b)); err != nil {
						return err
					}
				}
				b[at] = orig
			}
		}
	}
	return nil
}
