package main

import (
	"fmt"
	"strings"
	"testing"

	"golang.org/x/image/font"
)

// Every row label the demo has fits the chart's label column, wrapped: no
// line, measured in the chart's own font, reaches the oversold column,
// whose bars and figures ("a stale write refused", an oversold unit) it
// would cover; and the lines keep the label whole.
func TestChartLabelsClearTheBars(t *testing.T) {
	rows, face := demoRows(t), chartFace(t)
	if len(rows) < 31 {
		t.Fatalf("%d rows; the test wants the demo's every row", len(rows))
	}
	for i, r := range rows {
		label := fmt.Sprintf("%d. %s", i+1, r.label())
		lines := labelLines(face, label)
		for _, line := range lines {
			if end := labelX + font.MeasureString(face, line).Ceil(); end > labelWidth-labelGap {
				t.Errorf("row %d: line %q ends at x=%d, over the oversold column at %d (less a gap of %d)",
					i+1, line, end, labelWidth, labelGap)
			}
		}
		if got := strings.Join(lines, " "); got != label {
			t.Errorf("row %d: lines %q, want label %q whole", i+1, lines, label)
		}
	}
}

// The rows lie one under the other, each label's lines within its own
// band, however many lines it has.
func TestChartLayoutKeepsLinesInTheirRow(t *testing.T) {
	face := chartFace(t)
	var results []result
	for _, r := range demoRows(t) {
		results = append(results, result{Row: r})
	}
	layout, height := chartLayout(face, results)
	m := face.Metrics()
	top, wrapped := headerSpace, 0
	for i, row := range layout {
		if row.top != top {
			t.Errorf("row %d starts at %d, want %d: right under the row before", i+1, row.top, top)
		}
		if len(row.lines) > 1 {
			wrapped++
		}
		first := row.top + row.height/2 + 5 - (len(row.lines)-1)*lineHeight/2
		last := first + (len(row.lines)-1)*lineHeight
		if first-m.Ascent.Ceil() < row.top || last+m.Descent.Ceil() > row.top+row.height {
			t.Errorf("row %d: lines from %d to %d (baselines), outside its band %d..%d", i+1, first, last, row.top, row.top+row.height)
		}
		top += row.height
	}
	if height != top+footerSpace || wrapped == 0 {
		t.Errorf("height %d, want %d; %d rows wrapped, want some", height, top+footerSpace, wrapped)
	}
}

// chartFace is the chart's font, closed when the test ends.
func chartFace(t *testing.T) font.Face {
	t.Helper()
	face, err := newFace(fontSize)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { face.Close() })
	return face
}

// demoRows are every row of the demo: the faults, the lock families, the
// lifecycle and Stripe's.
func demoRows(t *testing.T) []row {
	t.Helper()
	o, err := parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	return experiment(o)
}
