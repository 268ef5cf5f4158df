package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/gofont/goregular"
	"golang.org/x/image/font/opentype"
	"golang.org/x/image/math/fixed"
)

// Chart layout, in pixels.
const (
	chartWidth  = 1240
	labelWidth  = 470
	panelWidth  = 360
	panelGap    = 30
	rowHeight   = 34
	barHeight   = 18
	headerSpace = 56
	footerSpace = 16
	// A row's label starts at labelX and must end labelGap before the
	// oversold column (labelWidth), or it runs over that column's bars and
	// figures; a longer label wraps onto lines lineHeight apart, and its
	// row grows by lineHeight for each line after the first.
	labelX     = 52
	labelGap   = 12
	lineHeight = 16
	// fontSize is the chart's text size, in points at 72 DPI (pixels).
	fontSize = 13
)

// labelRoom is the width a label's line may take.
const labelRoom = labelWidth - labelGap - labelX

var (
	ink       = color.RGBA{0x22, 0x22, 0x22, 0xff}
	grey      = color.RGBA{0x99, 0x99, 0x99, 0xff}
	rule      = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	oversoldC = color.RGBA{0xd6, 0x27, 0x28, 0xff}
	ordersC   = color.RGBA{0x1f, 0x77, 0xb4, 0xff}
	okC       = color.RGBA{0x2c, 0xa0, 0x2c, 0xff}
)

// chartRow is where a result's row goes: its band from top, height high,
// and its label's lines.
type chartRow struct {
	top, height int
	lines       []string
}

// chartLayout places the results' rows one under the other below the
// header, each as tall as its label's lines need, and returns them and the
// chart's height.
func chartLayout(face font.Face, results []result) ([]chartRow, int) {
	rows := make([]chartRow, len(results))
	top := headerSpace
	for i, r := range results {
		lines := labelLines(face, fmt.Sprintf("%d. %s", r.number(i), r.Row.label()))
		rows[i] = chartRow{top: top, height: rowHeight + (len(lines)-1)*lineHeight, lines: lines}
		top += rows[i].height
	}
	return rows, top + footerSpace
}

// labelLines breaks label into lines of at most labelRoom pixels in face:
// after its commas where it can (each part of a label is a setting or a
// fault, and reads whole), else between words. A single word wider than
// the room, which no label has, stays on a line of its own.
func labelLines(face font.Face, label string) []string {
	fits := func(s string) bool { return font.MeasureString(face, s).Ceil() <= labelRoom }
	var lines []string
	line := ""
	add := func(part, sep string) {
		switch {
		case line == "":
			line = part
		case fits(line + sep + part):
			line += sep + part
		default:
			lines = append(lines, line)
			line = part
		}
	}
	for _, part := range strings.SplitAfter(label, ", ") {
		part = strings.TrimSuffix(part, " ")
		if fits(part) {
			add(part, " ")
			continue
		}
		for _, word := range strings.Fields(part) {
			add(word, " ")
		}
	}
	return append(lines, line)
}

// drawChart draws two bar panels, one row per result: oversold units and
// orders per second, each on its own scale. Long labels wrap within the
// label column (labelLines), so that none runs over the bars.
func drawChart(w io.Writer, results []result) error {
	face, err := newFace(fontSize)
	if err != nil {
		return err
	}
	defer face.Close()
	layout, height := chartLayout(face, results)
	img := image.NewRGBA(image.Rect(0, 0, chartWidth, height))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)

	var maxOversold, maxRate float64
	for _, r := range results {
		maxOversold = max(maxOversold, float64(r.Verify.Oversold))
		maxRate = max(maxRate, r.ordersPerSecond())
	}
	oversoldX := labelWidth
	rateX := labelWidth + panelWidth + panelGap
	text(img, face, 12, 22, ink, "The lock experiment: every figure from shop verify and the load test")
	text(img, face, oversoldX, headerSpace-10, oversoldC, "oversold units")
	text(img, face, rateX, headerSpace-10, ordersC, "orders/s")

	for i, r := range results {
		top := layout[i].top
		mid := top + layout[i].height/2
		fill(img, image.Rect(12, top, chartWidth-12, top+1), rule)
		mark, markC := "ok", okC
		switch {
		case r.failed():
			mark, markC = "FAIL", oversoldC
		case !r.Verify.OK:
			mark, markC = "race", oversoldC
		}
		// The lines are centred on the row's middle, as the bars are.
		first := mid + 5 - (len(layout[i].lines)-1)*lineHeight/2
		text(img, face, 12, first, markC, mark)
		for k, line := range layout[i].lines {
			text(img, face, labelX, first+k*lineHeight, ink, line)
		}

		bar(img, face, oversoldX, mid, float64(r.Verify.Oversold), maxOversold, oversoldC, fmt.Sprint(r.Verify.Oversold))
		bar(img, face, rateX, mid, r.ordersPerSecond(), maxRate, ordersC, fmt.Sprintf("%.0f", r.ordersPerSecond()))
	}
	return png.Encode(w, img)
}

// bar draws a horizontal bar of v on a scale of top at x, centred on y, and
// writes its value after it.
func bar(img *image.RGBA, face font.Face, x, y int, v, top float64, c color.Color, value string) {
	const room = panelWidth - 60 // leave space for the value
	n := 0
	if top > 0 {
		n = int(v / top * room)
	}
	if v > 0 {
		n = max(n, 2)
	}
	fill(img, image.Rect(x, y-barHeight/2, x+n, y+barHeight/2), c)
	text(img, face, x+n+6, y+5, grey, value)
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

func text(img *image.RGBA, face font.Face, x, y int, c color.Color, s string) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: face, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func newFace(size float64) (font.Face, error) {
	f, err := opentype.Parse(goregular.TTF)
	if err != nil {
		return nil, err
	}
	return opentype.NewFace(f, &opentype.FaceOptions{Size: size, DPI: 72, Hinting: font.HintingFull})
}
