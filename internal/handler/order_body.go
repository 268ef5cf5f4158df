package handler

// orderBody is the body of POST /api/v1/orders as parseOrderBody reads
// it: each field and whether it was there.
type orderBody struct {
	sku, user       int64
	hasSKU, hasUser bool
}

// maxFastDigits is the most digits parseOrderBody reads: any number of
// them fits an int64. Longer numbers go to decode, which knows which of
// them fit.
const maxFastDigits = 18

// parseOrderBody reads the body every buyer sends, {"sku_id":N,"user_id":N}
// with either field left out, in any order, with JSON's white space, and
// ok is true; without the reflection, buffers and second pass of decode,
// which it gives the same values as. Anything else (other names, names
// given twice or in other letter case or with escapes, null, numbers with
// fractions or exponents or more than maxFastDigits digits, more than the
// object) is not ok, and goes to decode, which accepts or refuses it with
// the words it always has.
func parseOrderBody(b []byte) (o orderBody, ok bool) {
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return o, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return o, false // {}: decode says what is missing
	}
	for {
		var (
			name  string
			value int64
		)
		if name, i, ok = parseName(b, i); !ok {
			return o, false
		}
		i = skipSpace(b, i)
		if i == len(b) || b[i] != ':' {
			return o, false
		}
		if value, i, ok = parseInt(b, skipSpace(b, i+1)); !ok {
			return o, false
		}
		switch {
		case name == "sku_id" && !o.hasSKU:
			o.sku, o.hasSKU = value, true
		case name == "user_id" && !o.hasUser:
			o.user, o.hasUser = value, true
		default:
			return o, false
		}
		i = skipSpace(b, i)
		if i == len(b) {
			return o, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
			continue
		case '}':
			return o, skipSpace(b, i+1) == len(b)
		}
		return o, false
	}
}

// skipSpace returns the index of the first byte at or after i in b that
// is not JSON's white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// parseName reads a member's name at b[i]: "sku_id" or "user_id" exactly,
// and returns the index after it. Any other name is not ok.
func parseName(b []byte, i int) (string, int, bool) {
	for _, name := range [...]string{`"sku_id"`, `"user_id"`} {
		if len(b)-i >= len(name) && string(b[i:i+len(name)]) == name {
			return name[1 : len(name)-1], i + len(name), true
		}
	}
	return "", i, false
}

// parseInt reads a JSON integer at b[i], -?(0|[1-9][0-9]*) of at most
// maxFastDigits digits, not followed by a fraction or an exponent, and
// returns it with the index after it.
func parseInt(b []byte, i int) (int64, int, bool) {
	neg := i < len(b) && b[i] == '-'
	if neg {
		i++
	}
	start := i
	var n int64
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		n = n*10 + int64(b[i]-'0')
		i++
	}
	digits := i - start
	switch {
	case digits == 0 || digits > maxFastDigits,
		digits > 1 && b[start] == '0',
		i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E'):
		return 0, i, false
	}
	if neg {
		n = -n
	}
	return n, i, true
}
