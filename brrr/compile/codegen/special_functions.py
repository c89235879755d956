"""Special functions for generated kernels (codegen helper, beside shim.py): the gamma, error-function and Bessel
families and Hurwitz zeta, as @triton.jit helpers from portable primitives; the orthogonal polynomials are in
orthogonal_polynomials.py.

The algorithms and tables are described below; zeta's direct sum runs in float64, as eager's does (in fp32 its
terms cancel for negative x). shim.HELPERS takes these in; codegen copies only the helpers a kernel uses.
"""

import re

from brrr.compile.codegen.orthogonal_polynomials import POLYNOMIALS

# Gamma, error-function and Bessel families and the orthogonal polynomials, in fp32 (mathops.FP32_ACCURATE:
# float64 tensors keep ATen). Each follows the algorithm ATen's CPU kernel runs for float32 (Cephes-style series
# and rational approximations, evaluated in fp32 the way eager evaluates them), so results agree with eager's,
# special values (poles, infinities, NaN) included. The coefficient tables are the Cephes library's; erfcx's is
# a Chebyshev fit of erfcx(x) / y over y = 4 / (4 + x) in [4/54, 1], made for brrr. `@horner(NAME, v)`,
# `@chbevl(NAME, v)` and `@clenshaw(NAME, v)` in a helper's source expand to the evaluation of table NAME at v.

_COEFFS = {
    "AIRY_AN": [0.346538101525629, 12.007595273964581, 76.27960536152345, 168.08922493463058, 159.75639135016442,
        70.53609068404442, 14.026469116338967, 1.0],
    "AIRY_AD": [0.5675945326387702, 14.75625625848472, 84.51389701414746, 177.31808814540045, 164.2346928715297,
        71.47784008255756, 14.095913560783403, 1.0],
    "AIRY_AFN": [-0.1316963234183318, -0.6264565444319123, -0.6931580360369335, -0.2797799815451191,
        -0.04919001326095003, -0.004062659235948854, -0.0001592764962392621, -2.776491081552329e-06,
        -1.6778769848911465e-08],
    "AIRY_AFD": [13.356042070655324, 32.682503279522464, 26.736704094149957, 9.187074029072596, 1.4752914677166642,
        0.11568717379518804, 0.004402916416152112, 7.547203482874142e-05, 4.5185009297058035e-07],
    "AIRY_AGN": [0.01973399320916857, 0.39110302961568827, 1.0657989759959559, 0.9391692298166502,
        0.35146565610554764, 0.06338889196289255, 0.005858041130483885, 0.000282851600836737, 6.98793669997261e-06,
        8.117892395543892e-08, 3.415517847659236e-10],
    "AIRY_AGD": [9.30892908077442, 19.835292871831214, 15.564662893286462, 5.476860694229755, 0.9542936116189619,
        0.08645808263523921, 0.004126565238242226, 0.00010125908511650914, 1.1716673321441352e-06,
        4.9183457006293e-09],
    "J0_PP": [0.0007969367292973471, 0.08283523921074408, 1.239533716464143, 5.447250030587687, 8.74716500199817,
        5.303240382353949, 1.0],
    "J0_PQ": [0.0009244088105588637, 0.08562884743544745, 1.2535274390105895, 5.470977403304171, 8.761908832370695,
        5.306052882353947, 1.0],
    "J0_QP": [-0.011366383889846916, -1.2825271867050931, -19.553954425773597, -93.20601521237683,
        -177.68116798048806, -147.07750515495118, -51.41053267665993, -6.050143506007285],
    "J0_QQ": [64.3178256118178, 856.4300259769806, 3882.4018360540163, 7240.467741956525, 5930.727011873169,
        2062.0933166032783, 242.0057402402914],
    "J0_RP": [-4794432209.782018, 1956174919465.5657, -249248344360967.72, 9708622510473064.0],
    "J0_RQ": [499.563147152651, 173785.4016763747, 48440965.83399621, 11185553704.535683, 2112775201154.892,
        310518229857422.56, 3.1812195594320496e+16, 1.7108629408104315e+18],
    "J1_PP": [0.0007621256162081731, 0.07313970569409176, 1.1271960812968493, 5.112079511468076, 8.424045901417724,
        5.214515986823615, 1.0],
    "J1_PQ": [0.0005713231280725487, 0.06884559087544954, 1.105142326340617, 5.073863861286015, 8.399855543276042,
        5.209828486823619, 1.0],
    "J1_QP": [0.05108625947501766, 4.982138729512334, 75.82382841325453, 366.7796093601508, 710.8563049989261,
        597.4896124006136, 211.68875710057213, 25.207020585802372],
    "J1_QQ": [74.23732770356752, 1056.4488603826283, 4986.410583376536, 9562.318924047562, 7997.041604473507,
        2826.1927851763908, 336.0936078106983],
    "J1_RP": [-899971225.7055594, 452228297998.19403, -72749424522181.83, 3682957328638529.0],
    "J1_RQ": [620.8364781180543, 256987.25675774884, 83514679.14319493, 22151159547.97925, 4749141220799.914,
        784369607876235.9, 8.952223361846274e+16, 5.322786203326801e+18],
    "Y0_PP": [0.0007969367292973471, 0.08283523921074408, 1.239533716464143, 5.447250030587687, 8.74716500199817,
        5.303240382353949, 1.0],
    "Y0_PQ": [0.0009244088105588637, 0.08562884743544745, 1.2535274390105895, 5.470977403304171, 8.761908832370695,
        5.306052882353947, 1.0],
    "Y0_QP": [-0.011366383889846916, -1.2825271867050931, -19.553954425773597, -93.20601521237683,
        -177.68116798048806, -147.07750515495118, -51.41053267665993, -6.050143506007285],
    "Y0_QQ": [64.3178256118178, 856.4300259769806, 3882.4018360540163, 7240.467741956525, 5930.727011873169,
        2062.0933166032783, 242.0057402402914],
    "Y0_YP": [15592.436785523574, -14663929.59039716, 5435264770.518765, -982136065717.9115, 87590639439536.7,
        -3466283033847297.0, 4.4273326857256984e+16, -1.8495080043698668e+16],
    "Y0_YQ": [1041.2835366425984, 626107.330137135, 268919633.39381415, 86400248710.3935, 20297961275010.555,
        3171577528429750.5, 2.5059625617265306e+17],
    "Y1_PP": [0.0007621256162081731, 0.07313970569409176, 1.1271960812968493, 5.112079511468076, 8.424045901417724,
        5.214515986823615, 1.0],
    "Y1_PQ": [0.0005713231280725487, 0.06884559087544954, 1.105142326340617, 5.073863861286015, 8.399855543276042,
        5.209828486823619, 1.0],
    "Y1_QP": [0.05108625947501766, 4.982138729512334, 75.82382841325453, 366.7796093601508, 710.8563049989261,
        597.4896124006136, 211.68875710057213, 25.207020585802372],
    "Y1_QQ": [74.23732770356752, 1056.4488603826283, 4986.410583376536, 9562.318924047562, 7997.041604473507,
        2826.1927851763908, 336.0936078106983],
    "Y1_YP": [1263204747.9017804, -647355876379.1603, 114509511541823.73, -8127702555013251.0,
        2.024394757135949e+17, -7.788771962659501e+17],
    "Y1_YQ": [594.3015923461282, 235564.09294306856, 73481194.44597217, 18760131610.870617, 3882312774962.3857,
        620557727146953.8, 6.871410873553005e+16, 3.9727060811656064e+18],
    "MI1_A": [2.7779141127610464e-18, -2.111421214358166e-17, 1.5536319577362005e-16, -1.1055969477353862e-15,
        7.600684294735408e-15, -5.042185504727912e-14, 3.223793365945575e-13, -1.9839743977649436e-12,
        1.1736186298890901e-11, -6.663489723502027e-11, 3.625590281552117e-10, -1.8872497517228294e-09,
        9.381537386495773e-09, -4.445059128796328e-08, 2.0032947535521353e-07, -8.568720264695455e-07,
        3.4702513081376785e-06, -1.3273163656039436e-05, 4.781565107550054e-05, -0.00016176081582589674,
        0.0005122859561685758, -0.0015135724506312532, 0.004156422944312888, -0.010564084894626197,
        0.024726449030626516, -0.05294598120809499, 0.1026436586898471, -0.17641651835783406, 0.25258718644363365],
    "MI1_B": [7.517296310842105e-18, 4.414348323071708e-18, -4.6503053684893586e-17, -3.209525921993424e-17,
        2.96262899764595e-16, 3.3082023109209285e-16, -1.8803547755107825e-15, -3.8144030724370075e-15,
        1.0420276984128802e-14, 4.272440016711951e-14, -2.1015418427726643e-14, -4.0835511110921974e-13,
        -7.198551776245908e-13, 2.0356285441470896e-12, 1.4125807436613782e-11, 3.2526035830154884e-11,
        -1.8974958123505413e-11, -5.589743462196584e-10, -3.835380385964237e-09, -2.6314688468895196e-08,
        -2.512236237870209e-07, -3.882564808877691e-06, -0.00011058893876262371, -0.009761097491361469,
        0.7785762350182801],
    "K0_A": [1.374465435613523e-16, 4.25981614279661e-14, 1.0349695257633842e-11, 1.904516377220209e-09,
        2.5347910790261494e-07, 2.286212103119452e-05, 0.001264615411446926, 0.0359799365153615,
        0.3442898999246285, -0.5353273932339028],
    "K0_B": [5.300433772686263e-18, -1.6475804301524212e-17, 5.2103915050390274e-17, -1.678231096805412e-16,
        5.512055978524319e-16, -1.848593377343779e-15, 6.3400764774050706e-15, -2.2275133269916698e-14,
        8.032890775363575e-14, -2.9800969231727303e-13, 1.140340588208475e-12, -4.514597883373944e-12,
        1.8559491149547177e-11, -7.957489244477107e-11, 3.577397281400301e-10, -1.69753450938906e-09,
        8.574034017414225e-09, -4.660489897687948e-08, 2.766813639445015e-07, -1.8317555227191195e-06,
        1.39498137188765e-05, -0.00012849549581627802, 0.0015698838857300533, -0.0314481013119645,
        2.4403030820659555],
    "K1_A": [-7.023863479386288e-18, -2.427449850519366e-15, -6.666901694199329e-13, -1.4114883926335278e-10,
        -2.213387630734726e-08, -2.4334061415659684e-06, -0.0001730288957513052, -0.006975723859639864,
        -0.12261118082265715, -0.3531559607765449, 1.5253002273389478],
    "K1_B": [-5.756744483665017e-18, 1.7940508731475592e-17, -5.689462558442859e-17, 1.838093544366639e-16,
        -6.057047248373319e-16, 2.038703165624334e-15, -7.019837090418314e-15, 2.4771544244813043e-14,
        -8.976705182324994e-14, 3.3484196660784293e-13, -1.2891739609510289e-12, 5.13963967348173e-12,
        -2.1299678384275683e-11, 9.218315187605006e-11, -4.1903547593418965e-10, 2.015049755197033e-09,
        -1.0345762465678097e-08, 5.7410841254500495e-08, -3.5019606030878126e-07, 2.406484947837217e-06,
        -1.936197974166083e-05, 0.00019521551847135162, -0.002857816859622779, 0.10392373657681724,
        2.7206261904844427],
    "NDTRI_P0": [-59.96335010141079, 98.00107541859997, -56.67628574690703, 13.931260938727968,
        -1.2391658386738125],
    "NDTRI_Q0": [1.0, 1.9544885833814176, 4.676279128988815, 86.36024213908905, -225.46268785411937,
        200.26021238006066, -82.03722561683334, 15.90562251262117, -1.1833162112133],
    "NDTRI_P1": [4.0554489230596245, 31.525109459989388, 57.16281922464213, 44.08050738932008, 14.684956192885803,
        2.1866330685079025, -0.1402560791713545, -0.03504246268278482, -0.0008574567851546854],
    "NDTRI_Q1": [1.0, 15.779988325646675, 45.39076351288792, 41.3172038254672, 15.04253856929075,
        2.504649462083094, -0.14218292285478779, -0.03808064076915783, -0.0009332594808954574],
    "NDTRI_P2": [3.2377489177694603, 6.915228890689842, 3.9388102529247444, 1.3330346081580755,
        0.20148538954917908, 0.012371663481782003, 0.00030158155350823543, 2.6580697468673755e-06,
        6.239745391849833e-09],
    "NDTRI_Q2": [1.0, 6.02427039364742, 3.6798356385616087, 1.3770209948908132, 0.21623699359449663,
        0.013420400608854318, 0.00032801446468212774, 2.8924786474538068e-06, 6.790194080099813e-09],
    "I0E_A": [-4.4153416464793395e-18, 3.3307945188222384e-17, -2.431279846547955e-16, 1.715391285555133e-15,
        -1.1685332877993451e-14, 7.676185498604936e-14, -4.856446783111929e-13, 2.95505266312964e-12,
        -1.726826291441556e-11, 9.675809035373237e-11, -5.189795601635263e-10, 2.6598237246823866e-09,
        -1.300025009986248e-08, 6.046995022541919e-08, -2.670793853940612e-07, 1.1173875391201037e-06,
        -4.4167383584587505e-06, 1.6448448070728896e-05, -5.754195010082104e-05, 0.00018850288509584165,
        -0.0005763755745385824, 0.0016394756169413357, -0.004324309995050576, 0.010546460394594998,
        -0.02373741480589947, 0.04930528423967071, -0.09490109704804764, 0.17162090152220877, -0.3046826723431984,
        0.6767952744094761],
    "I0E_B": [-7.233180487874754e-18, -4.830504485944182e-18, 4.46562142029676e-17, 3.461222867697461e-17,
        -2.8276239805165836e-16, -3.425485619677219e-16, 1.7725601330565263e-15, 3.8116806693526224e-15,
        -9.554846698828307e-15, -4.150569347287222e-14, 1.54008621752141e-14, 3.8527783827421426e-13,
        7.180124451383666e-13, -1.7941785315068062e-12, -1.3215811840447713e-11, -3.1499165279632416e-11,
        1.1889147107846439e-11, 4.94060238822497e-10, 3.3962320257083865e-09, 2.266668990498178e-08,
        2.0489185894690638e-07, 2.8913705208347567e-06, 6.889758346916825e-05, 0.0033691164782556943,
        0.8044904110141088],
    "I1E_A": [9.381537386495773e-09, -4.445059128796328e-08, 2.0032947535521353e-07, -8.568720264695455e-07,
        3.4702513081376785e-06, -1.3273163656039436e-05, 4.781565107550054e-05, -0.00016176081582589674,
        0.0005122859561685758, -0.0015135724506312532, 0.004156422944312888, -0.010564084894626197,
        0.024726449030626516, -0.05294598120809499, 0.1026436586898471, -0.17641651835783406, 0.25258718644363365],
    "I1E_B": [-3.835380385964237e-09, -2.6314688468895196e-08, -2.512236237870209e-07, -3.882564808877691e-06,
        -0.00011058893876262371, -0.009761097491361469, 0.7785762350182801],

    "ERFCX": [
        2.7557041771093313e-14, 1.5910431104437446e-13, -7.696128056039326e-13, -7.903102804263781e-12,
        1.0040938316752602e-11, 3.699852124591568e-10, 1.0407678909409527e-09, -1.2343279999249545e-08,
        -1.2386914354254387e-07, -2.1558971093999677e-07, 5.223870615309698e-06, 6.70957348401817e-05,
        0.0004942528026146443, 0.002719721744750627, 0.012087970244571597, 0.0448573685486896, 0.1409803855363019,
        0.3762056717515375, 0.4225826601559097],
}


def _horner(name, v):
    """Cephes' polevl: the table's first coefficient is the highest power's."""
    c = _COEFFS[name]
    expr = repr(c[0])
    for k in c[1:]:
        expr = f"({expr}) * {v} + {k!r}"
    return f"({expr})"


def _expand(src):
    """Expand `@horner(NAME, v)` inline, and a line `out = @chbevl(NAME, v)` (Cephes' Chebyshev sum: half the
    difference of the last terms of Clenshaw's recurrence at v) or `out = @clenshaw(NAME, u)` (sum c_k T_k(u),
    the table highest degree first) into the statements that compute it."""
    src = re.sub(r"@horner\((\w+), (\w+)\)", lambda m: _horner(m.group(1), m.group(2)), src)
    lines = []
    for n, line in enumerate(src.split("\n")):
        m = re.match(r"(\s*)(\w+) = @(chbevl|clenshaw)\((\w+), (.+)\)$", line)
        if not m:
            lines.append(line)
            continue
        ind, out, kind, name, arg = m.groups()
        c = _COEFFS[name]
        v, b0, b1, b2 = (f"{s}_{n}" for s in ("v", "b0", "b1", "b2"))
        lines.append(f"{ind}{v} = {arg}")
        if kind == "chbevl":
            lines.append(f"{ind}{b0} = tl.zeros_like({v}) + {c[0]!r}")
            lines.append(f"{ind}{b1} = tl.zeros_like({v})")
            lines.append(f"{ind}{b2} = tl.zeros_like({v})")
            for k in c[1:]:
                lines.append(f"{ind}{b2} = {b1}")
                lines.append(f"{ind}{b1} = {b0}")
                lines.append(f"{ind}{b0} = {v} * {b1} - {b2} + {k!r}")
            lines.append(f"{ind}{out} = 0.5 * ({b0} - {b2})")
        else:
            lines.append(f"{ind}{b1} = tl.zeros_like({v})")
            lines.append(f"{ind}{b2} = tl.zeros_like({v})")
            for k in c[:-1]:
                lines.append(f"{ind}{b0} = 2.0 * {v} * {b1} - {b2} + {k!r}")
                lines.append(f"{ind}{b2} = {b1}")
                lines.append(f"{ind}{b1} = {b0}")
            lines.append(f"{ind}{out} = {v} * {b1} - {b2} + {c[-1]!r}")
    return "\n".join(lines)


_SPECIAL = {
    "lgamma": '''
@triton.jit
def lgamma(x):
    # log|Gamma(x)|. x >= 0: shifted up to z >= 8 (the product of the shifts taken off as a log), Stirling's
    # series at z; x < 0: log(pi / |sin(pi x)|) - lgamma(1 - x), sin(pi x) from r = x - round(x) (exact).
    # +inf at 0, the negative integers and both infinities
    neg = x < 0
    z = tl.where(neg, 1.0 - x, x)
    p = tl.zeros_like(z) + 1.0
    for _ in tl.static_range(8):
        small = z < 8.0
        p = tl.where(small, p * z, p)
        z = tl.where(small, z + 1.0, z)
    w = 1.0 / z
    w2 = w * w
    series = w * (0.08333333333333333 - w2 * (0.002777777777777778 - w2 * (0.0007936507936507937
                                                                            - w2 * 0.0005952380952380953)))
    r = (z - 0.5) * tl.log(z) - z + 0.9189385332046728 + series - tl.log(p)
    frac = x - tl.math.floor(x + 0.5)
    refl = 1.1447298858494002 - tl.log(tl.abs(tl.sin(3.141592653589793 * frac))) - r
    r = tl.where(neg, refl, r)
    return tl.where((tl.abs(x) == float("inf")) | (neg & (frac == 0)), float("inf"), r)
''',
    "digamma": '''
@triton.jit
def digamma(x):
    # psi(x): shifted up to z >= 8, the asymptotic series at z; x < 0: psi(1 - x) - pi cot(pi x) (cot from
    # r = x - round(x)); -inf at +0, +inf at -0, NaN at the negative integers and -inf, as eager
    neg = x < 0
    z = tl.where(neg, 1.0 - x, x)
    acc = tl.zeros_like(z)
    for _ in tl.static_range(8):
        small = z < 8.0
        acc = tl.where(small, acc - 1.0 / z, acc)
        z = tl.where(small, z + 1.0, z)
    w = 1.0 / (z * z)
    r = acc + tl.log(z) - 0.5 / z - w * (0.08333333333333333 - w * (0.008333333333333333 - w * (
        0.003968253968253968 - w * (0.004166666666666667 - w * 0.007575757575757576))))
    frac = x - tl.math.floor(x + 0.5)
    ang = 3.141592653589793 * frac
    r = tl.where(neg, r - 3.141592653589793 * tl.cos(ang) / tl.sin(ang), r)
    r = tl.where(neg & (frac == 0), float("nan"), r)
    return tl.where(x == 0, tl.where(signbit(x), float("inf"), float("-inf")), r)
''',
    "trigamma": '''
@triton.jit
def trigamma(x):
    # polygamma(1, x) as eager computes it in float32: reflection below 1/2 through sin(pi x) in fp32 (so a
    # negative integer gives eager's huge finite value), six shifts, then the asymptotic series
    neg = x < 0.5
    s = tl.sin(3.1415927410125732 * x)
    acc = tl.where(neg, -(9.86960506439209 / (s * s)), 0.0)
    z = tl.where(neg, 1.0 - x, x)
    for _ in tl.static_range(6):
        acc = acc + 1.0 / (z * z)
        z = z + 1.0
    ixx = 1.0 / (z * z)
    acc = acc + (1.0 + 1.0 / (2.0 * z) + ixx * (0.16666666666666666 - ixx * (0.03333333333333333
                                                                            - ixx * 0.023809523809523808))) / z
    return tl.where(neg, -acc, acc)
''',
    "zeta": '''
@triton.jit
def zeta(x, q):
    # Hurwitz zeta sum_k (q + k)^-x: terms summed up to q + k > 9 (ten at least), then the Euler-Maclaurin tail
    # (Bernoulli terms while they matter); eager's special cases: x = 1 inf, x < 1 NaN, q a non-positive integer
    # inf, q < 0 with x not whole NaN, x = inf by the limits of its sum
    x, q = tl.broadcast(x, q)
    pole = (q <= 0) & (q == tl.math.floor(q))
    n = tl.maximum(tl.math.floor(9.0 - q) + 1.0, 9.0)
    n = tl.where(pole | (n != n) | (q != q) | (x < 1), 9.0, n)
    nmax = tl.max(n).to(tl.int32)
    # the direct terms in float64 (eager sums in float64): below zero they alternate in sign and cancel; a whole
    # exponent (every q < 0 that is no NaN) takes them as exact powers, multiplications only
    whole = (x == tl.math.floor(x)) & (x <= 64.0) & (x >= 1.0)
    e = tl.where(whole, x, 0.0).to(tl.int32)
    q64 = q.to(tl.float64)
    direct = tl.where(whole, zeta_powi(q64, e), pow(q, -x).to(tl.float64))
    for k in range(1, nmax + 1):
        term = tl.where(whole, zeta_powi(q64 + k, e), pow(q + k, -x).to(tl.float64))
        direct = tl.where(k <= n, direct + term, direct)
    d32 = direct.to(tl.float32)
    w = q + n
    b = pow(w, -x)
    s = b * w / (x - 1.0) - 0.5 * b
    t = x * (b / w) / 12.0
    s = s + t
    done = tl.abs(t) <= 1e-10 * tl.abs(d32 + s)
@ZETA_TAIL
    s = (direct + s.to(tl.float64)).to(tl.float32)
    # eager sums the tail in float64 while its terms' products x (x + 1) ... (x + 22) stay finite: past that
    # a sum that underflowed to 0 turns NaN
    r = tl.where((x > 2.5256835601056977e13) & (q > 1.0), float("nan"), s)
    r = tl.where((q <= 0) & (x != tl.math.floor(x)), float("nan"), r)
    r = tl.where(pole, float("inf"), r)
    at_inf = tl.where(q == 1.0, 1.0, tl.where(q < 1.0, float("inf"), float("nan")))
    r = tl.where((x == float("inf")) & ~pole, at_inf, r)
    r = tl.where(x < 1.0, float("nan"), r)
    return tl.where(x == 1.0, float("inf"), r)
''',
    "zeta_powi": '''
@triton.jit
def zeta_powi(a, e):
    # a^-e for a whole e in 0..64 by binary powering (a float64)
    base = 1.0 / a
    r = tl.zeros_like(a) + 1.0
    for bit in tl.static_range(7):
        r = tl.where(((e >> bit) & 1) != 0, r * base, r)
        base = base * base
    return r
''',
    "erfinv": '''
@triton.jit
def erfinv(y):
    # eager's: a rational first guess (central and tail), two Newton steps on erf
    a = tl.abs(y)
    z = y * y
    num = ((-0.140543331 * z + 0.914624893) * z - 1.645349621) * z + 0.886226899
    dem = (((0.012229801 * z - 0.329097515) * z + 1.442710462) * z - 2.118377725) * z + 1.0
    central = y * num / dem
    zt = tl.sqrt(-tl.log((1.0 - a) / 2.0))
    num2 = ((1.641345311 * zt + 3.429567803) * zt - 1.624906493) * zt - 1.970840454
    dem2 = (1.6370678 * zt + 3.5438892) * zt + 1.0
    x = tl.where(a <= 0.7, central, tl.where(y < 0, -num2, num2) / dem2)
    x = x - (tl.math.erf(x) - y) / (1.1283791670955126 * tl.exp(-x * x))
    x = x - (tl.math.erf(x) - y) / (1.1283791670955126 * tl.exp(-x * x))
    x = tl.where(a == 1.0, tl.where(y < 0, float("-inf"), float("inf")), x)
    return tl.where(a > 1.0, float("nan"), x)
''',
    "erfcx": '''
@triton.jit
def erfcx(x):
    # exp(x^2) erfc(x). |x| <= 50: y = 4 / (4 + |x|) times a Chebyshev series in y; beyond: eager's continued
    # fraction (ispi / x past 5e7); x < 0: 2 exp(x^2) - erfcx(-x), as eager
    a = tl.abs(x)
    y = 4.0 / (4.0 + a)
    fit = @clenshaw(ERFCX, (y - 0.07407407407407407) * 2.16 - 1.0)
    aa = a * a
    cf = 0.5641895835477563 * (aa * (aa + 4.5) + 2.0) / (a * (aa * (aa + 5.0) + 3.75))
    pos = tl.where(a > 50.0, tl.where(a > 5e7, 0.5641895835477563 / a, cf), y * fit)
    e2 = 2.0 * tl.exp(x * x)
    neg = tl.where(x < -26.7, float("inf"), tl.where(x < -6.1, e2, e2 - pos))
    r = tl.where(x >= 0, pos, neg)
    return tl.where(x != x, x, r)
''',
    "ndtri": '''
@triton.jit
def ndtri(y0):
    # Cephes' ndtri as eager runs it in float32: a rational function of (y - 1/2)^2 in the middle, of
    # 1 / sqrt(-2 log y) in the tails
    flip = y0 > 0.8646647334098816
    y = tl.where(flip, 1.0 - y0, y0)
    ym = y - 0.5
    y2 = ym * ym
    xm = (ym + ym * (y2 * @horner(NDTRI_P0, y2) / @horner(NDTRI_Q0, y2))) * 2.5066282746310002
    xs = tl.sqrt(-2.0 * tl.log(y))
    x0 = xs - tl.log(xs) / xs
    z = 1.0 / xs
    x1 = tl.where(xs < 8.0, z * @horner(NDTRI_P1, z) / @horner(NDTRI_Q1, z),
                  z * @horner(NDTRI_P2, z) / @horner(NDTRI_Q2, z))
    xt = x0 - x1
    r = tl.where(y > 0.1353352832366127, xm, tl.where(flip, xt, -xt))
    r = tl.where((y0 < 0) | (y0 > 1), float("nan"), r)
    r = tl.where(y0 == 1.0, float("inf"), r)
    return tl.where(y0 == 0.0, float("-inf"), r)
''',
    "bessel_i0": '''
@triton.jit
def bessel_i0(x):
    # torch.i0 and special.modified_bessel_i0: exp(|x|) times Cephes' Chebyshev series for i0e
    a = tl.abs(x)
    small = @chbevl(I0E_A, a / 2.0 - 2.0)
    large = @chbevl(I0E_B, 32.0 / a - 2.0)
    return tl.where(a <= 8.0, tl.exp(a) * small, tl.exp(a) * large / tl.sqrt(a))
''',
    "bessel_i0e": '''
@triton.jit
def bessel_i0e(x):
    a = tl.abs(x)
    small = @chbevl(I0E_A, a / 2.0 - 2.0)
    large = @chbevl(I0E_B, 32.0 / a - 2.0)
    return tl.where(a <= 8.0, small, large / tl.sqrt(a))
''',
    "bessel_i1": '''
@triton.jit
def bessel_i1(x):
    # special.i1 in float32: eager's shorter float tables
    a = tl.abs(x)
    small = @chbevl(I1E_A, a / 2.0 - 2.0)
    large = @chbevl(I1E_B, 32.0 / a - 2.0)
    r = tl.where(a <= 8.0, tl.exp(a) * a * small, tl.exp(a) * large / tl.sqrt(a))
    return tl.where(x < 0, -r, r)
''',
    "bessel_i1e": '''
@triton.jit
def bessel_i1e(x):
    a = tl.abs(x)
    small = @chbevl(I1E_A, a / 2.0 - 2.0)
    large = @chbevl(I1E_B, 32.0 / a - 2.0)
    r = tl.where(a <= 8.0, small * a, large / tl.sqrt(a))
    return tl.where(x < 0, -r, r)
''',
    "modified_bessel_i1": '''
@triton.jit
def modified_bessel_i1(x):
    # special.modified_bessel_i1: the full tables
    a = tl.abs(x)
    small = @chbevl(MI1_A, a / 2.0 - 2.0)
    large = @chbevl(MI1_B, 32.0 / a - 2.0)
    r = tl.where(a <= 8.0, small * a * tl.exp(a), tl.exp(a) * large / tl.sqrt(a))
    return tl.where(x < 0, -r, r)
''',
    "bessel_k_join": '''
@triton.jit
def bessel_k_join(x, small, large, scaled: tl.constexpr):
    # K0 and K1 (times exp(x) when scaled) from their series up to 2 and their asymptotic series / sqrt(x)
    # beyond; inf at 0, NaN below
    large = large / tl.sqrt(x)
    if scaled:
        r = tl.where(x <= 2.0, small * tl.exp(x), large)
    else:
        r = tl.where(x <= 2.0, small, tl.exp(-x) * large)
    r = tl.where(x < 0, float("nan"), r)
    return tl.where(x == 0, float("inf"), r)
''',
    "bessel_k0": '''
@triton.jit
def bessel_k0(x, scaled: tl.constexpr):
    # special.modified_bessel_k0 (scaled: times exp(x)): a series with log(x / 2) i0(x) up to 2, an
    # asymptotic Chebyshev series beyond
    small = @chbevl(K0_A, x * x - 2.0)
    small = small - tl.log(0.5 * x) * bessel_i0(x)
    large = @chbevl(K0_B, 8.0 / x - 2.0)
    return bessel_k_join(x, small, large, scaled)
''',
    "bessel_k1": '''
@triton.jit
def bessel_k1(x, scaled: tl.constexpr):
    small = @chbevl(K1_A, x * x - 2.0)
    small = tl.log(0.5 * x) * modified_bessel_i1(x) + small / x
    large = @chbevl(K1_B, 8.0 / x - 2.0)
    return bessel_k_join(x, small, large, scaled)
''',
    "bessel_j0": '''
@triton.jit
def bessel_j0(x):
    # Cephes' j0: a rational function with the first two zeros factored out up to 5, the Hankel asymptotic form
    # beyond
    a = tl.abs(x)
    a2 = a * a
    small = (a2 - 5.783185962946784) * (a2 - 30.471262343662087) * @horner(J0_RP, a2) / @horner(J0_RQ, a2)
    small = tl.where(a < 1e-5, 1.0 - a2 / 4.0, small)
    w = 25.0 / a2
    ph = a - 0.7853981633974483
    large = (@horner(J0_PP, w) / @horner(J0_PQ, w) * tl.cos(ph)
             - 5.0 / a * (@horner(J0_QP, w) / @horner(J0_QQ, w)) * tl.sin(ph)) * 0.7978845608028654 / tl.sqrt(a)
    return tl.where(a <= 5.0, small, large)
''',
    "bessel_j1": '''
@triton.jit
def bessel_j1(x):
    a = tl.abs(x)
    a2 = a * a
    small = @horner(J1_RP, a2) / @horner(J1_RQ, a2) * a * (a2 - 14.681970642123893) * (a2 - 49.2184563216946)
    w = 5.0 / a * (5.0 / a)
    ph = a - 2.356194490192345
    large = (@horner(J1_PP, w) / @horner(J1_PQ, w) * tl.cos(ph)
             - 5.0 / a * (@horner(J1_QP, w) / @horner(J1_QQ, w)) * tl.sin(ph)) * 0.7978845608028654 / tl.sqrt(a)
    r = tl.where(a <= 5.0, small, large)
    return tl.where(x < 0, -r, r)
''',
    "bessel_y0": '''
@triton.jit
def bessel_y0(x):
    x2 = x * x
    small = @horner(Y0_YP, x2) / @horner(Y0_YQ, x2) + 0.6366197723675814 * tl.log(x) * bessel_j0(x)
    w = 25.0 / x2
    ph = x - 0.7853981633974483
    large = (@horner(Y0_PP, w) / @horner(Y0_PQ, w) * tl.sin(ph)
             + 5.0 / x * (@horner(Y0_QP, w) / @horner(Y0_QQ, w)) * tl.cos(ph)) * 0.7978845608028654 / tl.sqrt(x)
    r = tl.where(x <= 5.0, small, large)
    r = tl.where(x < 0, float("nan"), r)
    return tl.where(x == 0, float("-inf"), r)
''',
    "bessel_y1": '''
@triton.jit
def bessel_y1(x):
    x2 = x * x
    small = x * (@horner(Y1_YP, x2) / @horner(Y1_YQ, x2)) + 0.6366197723675814 * (bessel_j1(x) * tl.log(x) - 1.0 / x)
    w = 5.0 / x * (5.0 / x)
    ph = x - 2.356194490192345
    large = (@horner(Y1_PP, w) / @horner(Y1_PQ, w) * tl.sin(ph)
             + 5.0 / x * (@horner(Y1_QP, w) / @horner(Y1_QQ, w)) * tl.cos(ph)) * 0.7978845608028654 / tl.sqrt(x)
    r = tl.where(x <= 5.0, small, large)
    r = tl.where(x < 0, float("nan"), r)
    return tl.where(x == 0, float("-inf"), r)
''',
    "spherical_bessel_j0": '''
@triton.jit
def spherical_bessel_j0(x):
    x2 = x * x
    series = 1.0 + x2 * (-0.16666666666666666 + x2 * (0.008333333333333333 + x2 * (-0.0001984126984126984 + x2 * (
        2.755731922398589e-06 + x2 * (-2.505210838544172e-08 + x2 * 1.6059043836821613e-10)))))
    r = tl.where(tl.abs(x) < 0.5, series, tl.sin(x) / x)
    return tl.where(tl.abs(x) == float("inf"), 0.0, r)
''',
    "airy_ai": '''
@triton.jit
def airy_ai(x):
    # Cephes' airy (Ai only): asymptotic forms below -2.09 and from 2.09, the Maclaurin series (f, g) between,
    # summed until a term falls below fp32's epsilon as eager does
    sq = tl.sqrt(tl.abs(x))
    zn = 1.0 / (-2.0 * x * sq / 3.0)
    zz = zn * zn
    t = -2.0 * x * sq / 3.0 + 0.7853981633974483
    neg = 0.5641895835477563 / tl.sqrt(sq) * (tl.sin(t) * (1.0 + zz * @horner(AIRY_AFN, zz) / @horner(AIRY_AFD, zz))
                                              - tl.cos(t) * (zn * @horner(AIRY_AGN, zz) / @horner(AIRY_AGD, zz)))
    zeta = 2.0 * x * sq / 3.0
    iz = 1.0 / zeta
    pos = 0.5641895835477563 * (@horner(AIRY_AN, iz) / @horner(AIRY_AD, iz)) / (2.0 * tl.sqrt(sq) * tl.exp(zeta))
    f = tl.zeros_like(x) + 1.0
    g = x
    k = tl.zeros_like(x) + 1.0
    m = tl.zeros_like(x) + 1.0
    n = x
    z = x * x * x
    go = x == x
    for _ in tl.static_range(12):
        m1 = m * z
        k1 = k + 1.0
        m1 = m1 / k1
        n1 = n * z
        k1 = k1 + 1.0
        n1 = n1 / k1
        m1 = m1 / k1
        f1 = f + m1
        k1 = k1 + 1.0
        n1 = n1 / k1
        g = tl.where(go, g + n1, g)
        f = tl.where(go, f1, f)
        m = tl.where(go, m1, m)
        n = tl.where(go, n1, n)
        k = tl.where(go, k1, k)
        go = go & (tl.abs(m1 / f1) > 1.1920928955078125e-07)
    series = 0.3550280538878172 * f - 0.2588194037928068 * g
    r = tl.where(x < -2.09, neg, tl.where(x >= 2.09, pos, series))
    r = tl.where(x > 103.892, 0.0, r)
    return tl.where(tl.abs(x) == float("inf"), float("nan"), r)
''',
}


def _zeta_tail():
    # the Euler-Maclaurin terms t_i = x (x + 1) ... (x + 2i) / (w^(2i+1) B_i'), each from the last (no overflow)
    bern = [12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
            -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
            1.8152105401943546773e17, -7.1661652561756670113e18]
    lines = []
    for i in range(1, 12):
        lines += [f"    t = t * ((x + {2 * i - 1}.0) * (x + {2 * i}.0) / (w * w)) * {bern[i - 1] / bern[i]!r}",
                  "    s = tl.where(done, s, s + t)",
                  "    done = done | (tl.abs(t) <= 1e-10 * tl.abs(d32 + s))"]
    return "\n".join(lines)


_SPECIAL["zeta"] = _SPECIAL["zeta"].replace("@ZETA_TAIL", _zeta_tail())
_SPECIAL.update(POLYNOMIALS)
SPECIAL_HELPERS = {name: _expand(src) for name, src in _SPECIAL.items()}
