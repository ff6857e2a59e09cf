package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"kiln/loadgen"
)

// ModelBudget holds targets for a ModelReport (TOML), by test name as the
// report prints it ("pp512", "tg128 batch 1", "tg128@d512 batch 16"):
//
//	[min_tokens_per_s]
//	"tg128 batch 1" = 60
//	[min_roofline]
//	"tg128 batch 1" = 0.55
type ModelBudget struct {
	MinTokensPerS map[string]float64 `toml:"min_tokens_per_s"`
	MinRoofline   map[string]float64 `toml:"min_roofline"`
}

// ParseModelBudget reads a budget file's text; unknown keys are an error.
func ParseModelBudget(text string) (*ModelBudget, error) {
	var b ModelBudget
	if err := loadgen.DecodeBudget(text, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// name is a result's name in budgets.
func (x *ModelResult) name() string {
	if strings.HasPrefix(x.Test, "pp") {
		return x.Test
	}
	return fmt.Sprintf("%s batch %d", x.Test, x.Batch)
}

// Check compares r with the targets; a target naming no test of r is
// missed (measured NaN), so a typo cannot pass silently.
func (b *ModelBudget) Check(r *ModelReport) []loadgen.Verdict {
	var out []loadgen.Verdict
	check := func(kind string, targets map[string]float64, get func(*ModelResult) float64) {
		names := make([]string, 0, len(targets))
		for n := range targets {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			v := loadgen.Verdict{Name: kind + " " + n, Target: targets[n], Measured: nan}
			for i := range r.Results {
				if r.Results[i].name() == n {
					v.Measured = get(&r.Results[i])
				}
			}
			v.OK = v.Measured >= v.Target
			out = append(out, v)
		}
	}
	check("min_tokens_per_s", b.MinTokensPerS, func(x *ModelResult) float64 { return x.TokensPerSec })
	check("min_roofline", b.MinRoofline, func(x *ModelResult) float64 { return x.Roofline })
	return out
}

var nan = math.NaN()
