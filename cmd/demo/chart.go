package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"

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
)

var (
	ink       = color.RGBA{0x22, 0x22, 0x22, 0xff}
	grey      = color.RGBA{0x99, 0x99, 0x99, 0xff}
	rule      = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	oversoldC = color.RGBA{0xd6, 0x27, 0x28, 0xff}
	ordersC   = color.RGBA{0x1f, 0x77, 0xb4, 0xff}
	okC       = color.RGBA{0x2c, 0xa0, 0x2c, 0xff}
)

// drawChart draws two bar panels, one row per result: oversold units and
// orders per second, each on its own scale.
func drawChart(w io.Writer, results []result) error {
	face, err := newFace(13)
	if err != nil {
		return err
	}
	defer face.Close()
	height := headerSpace + rowHeight*len(results) + footerSpace
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
		top := headerSpace + i*rowHeight
		mid := top + rowHeight/2
		fill(img, image.Rect(12, top, chartWidth-12, top+1), rule)
		mark, markC := "ok", okC
		switch {
		case r.failed():
			mark, markC = "FAIL", oversoldC
		case !r.Verify.OK:
			mark, markC = "race", oversoldC
		}
		text(img, face, 12, mid+5, markC, mark)
		text(img, face, 52, mid+5, ink, fmt.Sprintf("%d. %s", r.number(i), r.Row.label()))

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
