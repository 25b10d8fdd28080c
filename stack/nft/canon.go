package nft

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/google/nftables/expr"
)

// The kernel returns a rule's expressions in its own terms: names become
// register loads, a set is referenced by name (the batch-local id is gone),
// lookups carry flags, a verdict is an immediate into the verdict register.
// Live and desired rules are therefore compared through this canonical text,
// which keeps exactly what decides a packet's fate and drops what the kernel
// does not echo back (set ids) or what changes on its own (counter values).
//
// Limitation: google/nftables silently skips expression types it cannot
// decode (e.g. rt, socket, tproxy), so a live rule padded with one of those
// would compare equal. Such drift needs root and deliberate effort. Of the
// expressions box itself writes only tproxy is not decoded: it is left out
// of the canonical text on both sides, and the address and port it takes
// (the immediates before it) are still compared.

// canonRule is the canonical text of a rule's expressions.
func canonRule(exprs []expr.Any) string {
	parts := make([]string, 0, len(exprs))
	for _, e := range exprs {
		if _, ok := e.(*expr.TProxy); ok {
			continue // never read back (above)
		}
		parts = append(parts, "[ "+canonExpr(e)+" ]")
	}
	return strings.Join(parts, " ")
}

func canonExpr(e expr.Any) string {
	switch e := e.(type) {
	case *expr.Meta:
		if e.SourceRegister {
			return fmt.Sprintf("meta set %s with reg %d", metaKeyName(e.Key), e.Register)
		}
		return fmt.Sprintf("meta load %s => reg %d", metaKeyName(e.Key), e.Register)
	case *expr.Cmp:
		return fmt.Sprintf("cmp %s reg %d 0x%s", cmpOpName(e.Op), e.Register, hex.EncodeToString(e.Data))
	case *expr.Ct:
		if e.SourceRegister {
			return fmt.Sprintf("ct set %d with reg %d dir %d", e.Key, e.Register, e.Direction)
		}
		return fmt.Sprintf("ct load %s => reg %d dir %d", ctKeyName(e.Key), e.Register, e.Direction)
	case *expr.Bitwise:
		return fmt.Sprintf("bitwise reg %d = (reg %d & 0x%s) ^ 0x%s len %d",
			e.DestRegister, e.SourceRegister, hex.EncodeToString(e.Mask), hex.EncodeToString(e.Xor), e.Len)
	case *expr.Payload:
		if e.OperationType == expr.PayloadWrite {
			return fmt.Sprintf("payload write reg %d => %db @ %s header + %d csum %d/%d/%d",
				e.SourceRegister, e.Len, payloadBaseName(e.Base), e.Offset, e.CsumType, e.CsumOffset, e.CsumFlags)
		}
		return fmt.Sprintf("payload load %db @ %s header + %d => reg %d", e.Len, payloadBaseName(e.Base), e.Offset, e.DestRegister)
	case *expr.Lookup:
		s := fmt.Sprintf("lookup reg %d set %s", e.SourceRegister, e.SetName)
		if e.IsDestRegSet {
			s += fmt.Sprintf(" dreg %d", e.DestRegister)
		}
		if e.Invert {
			s += " inverted"
		}
		return s
	case *expr.Verdict:
		if e.Chain != "" {
			return fmt.Sprintf("verdict %s %s", verdictName(e.Kind), e.Chain)
		}
		return "verdict " + verdictName(e.Kind)
	case *expr.Immediate:
		return fmt.Sprintf("immediate reg %d 0x%s", e.Register, hex.EncodeToString(e.Data))
	case *expr.NAT:
		return fmt.Sprintf("nat type %d family %d addr reg %d..%d proto reg %d..%d random %t/%t persistent %t prefix %t specified %t",
			e.Type, e.Family, e.RegAddrMin, e.RegAddrMax, e.RegProtoMin, e.RegProtoMax, e.Random, e.FullyRandom, e.Persistent, e.Prefix, e.Specified)
	case *expr.Counter:
		// Counter values tick; only its presence matters.
		return "counter"
	default:
		return fmt.Sprintf("%T %+v", e, e)
	}
}

func metaKeyName(k expr.MetaKey) string {
	switch k {
	case expr.MetaKeyIIFNAME:
		return "iifname"
	case expr.MetaKeyOIFNAME:
		return "oifname"
	case expr.MetaKeyBRIIIFNAME:
		return "bri_iifname"
	case expr.MetaKeyBRIOIFNAME:
		return "bri_oifname"
	case expr.MetaKeyL4PROTO:
		return "l4proto"
	case expr.MetaKeyIIF:
		return "iif"
	case expr.MetaKeyOIF:
		return "oif"
	case expr.MetaKeyPROTOCOL:
		return "protocol"
	case expr.MetaKeyNFPROTO:
		return "nfproto"
	case expr.MetaKeyMARK:
		return "mark"
	}
	return fmt.Sprintf("key%d", k)
}

func cmpOpName(op expr.CmpOp) string {
	switch op {
	case expr.CmpOpEq:
		return "eq"
	case expr.CmpOpNeq:
		return "neq"
	case expr.CmpOpLt:
		return "lt"
	case expr.CmpOpLte:
		return "lte"
	case expr.CmpOpGt:
		return "gt"
	case expr.CmpOpGte:
		return "gte"
	}
	return fmt.Sprintf("op%d", op)
}

func ctKeyName(k expr.CtKey) string {
	switch k {
	case expr.CtKeySTATE:
		return "state"
	case expr.CtKeySTATUS:
		return "status"
	case expr.CtKeyDIRECTION:
		return "direction"
	}
	return fmt.Sprintf("key%d", k)
}

func payloadBaseName(b expr.PayloadBase) string {
	switch b {
	case expr.PayloadBaseLLHeader:
		return "link"
	case expr.PayloadBaseNetworkHeader:
		return "network"
	case expr.PayloadBaseTransportHeader:
		return "transport"
	}
	return fmt.Sprintf("base%d", b)
}

func verdictName(k expr.VerdictKind) string {
	switch k {
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictJump:
		return "jump"
	case expr.VerdictGoto:
		return "goto"
	case expr.VerdictContinue:
		return "continue"
	}
	return fmt.Sprintf("verdict%d", k)
}
