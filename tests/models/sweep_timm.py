"""The timm architectures of the sweep (`python -m tests.models.sweep`): one small model of each
family timm has beyond the zoo (tests/models/timm_zoo.py), random weights (`perturb_weights`), on
a [1, 3, 64, 64] image where the model takes one, else at its ``img_size=64``, else at its own
input size. The sweep builds them fed NHWC and counts their runtime transposes against the
model's own permutes."""

from __future__ import annotations

import torch

from tests import torchvision_shim
from tests.models.timm_zoo import TimmModel

SIZE = 64
NAMES = """
bat_resnext26ts botnet26t_256 cait_xxs24_224 coat_lite_tiny coatnet_0_rw_224 convit_tiny crossvit_tiny_240
cs3darknet_focus_s cspresnet50 csatv2 davit_tiny deit_tiny_patch16_224 dla34 dla46_c dm_nfnet_f0 dpn48b
ecaresnet26t edgenext_xx_small efficientformer_l1 efficientformerv2_s0 efficientnet_lite0 efficientnetv2_rw_t
efficientvit_b0 efficientvit_m0 ese_vovnet19b_dw eva02_tiny_patch14_224 fasternet_t0 fastvit_mci0 fastvit_t8
fbnetc_100 focalnet_tiny_srf gcvit_xxtiny gernet_s ghostnetv2_100 ghostnetv3_050 gmlp_ti16_224 halonet26t
hardcorenas_a hgnet_tiny hgnetv2_b0 hiera_tiny_224 hrnet_w18_small hrnet_w18_small_v2 inception_next_tiny
inception_v3 inception_v4 lambda_resnet26t lcnet_050 legacy_seresnet18 levit_128s mambaout_femto
maxvit_tiny_rw_224 mixer_s16_224 mixnet_s mnasnet_small mobilenetv1_100 mobilenetv4_conv_small
mobilenetv4_hybrid_medium mobilenetv5_300m mobileone_s0 mobilevit_xxs nest_tiny nextvit_small nf_resnet26
nfnet_l0 pit_ti_224 poolformerv2_s12 pvt_v2_b0 rdnet_tiny regnetz_005 repghostnet_050 repvit_m0_9
res2net50_14w_8s resmlp_12_224 resnet10t resnet18 resnet26d resnetaa34d resnetblur18 resnext26ts rexnet_100
selecsls42b sequencer2d_s seresnext26d_32x4d shvit_s1 starnet_s1 swin_tiny_patch4_window7_224
test_byobnet test_coatnet test_convnext test_convnext2 test_convnext3 test_efficientnet test_efficientnet_evos
test_efficientnet_gn test_efficientnet_ln test_mambaout test_maxvit test_nfnet test_vit test_vit2 test_vit3
test_vit4 test_vit_relpos tf_efficientnet_b0 tf_mobilenetv3_small_minimal_100 tinynet_e tiny_vit_5m_224
tnt_s_patch16_224 tresnet_m twins_svt_small vgg11_bn visformer_tiny vitamin_small_224 volo_d1_224
xception41 xcit_nano_12_p16_224
""".split()


def make(name: str):
    """(timm's `name` in eval mode with perturbed weights, (NCHW image,)), as the zoo makes its
    models (timm_zoo.TimmModel): at SIZE where it runs there, or made for SIZE, else at its own
    input size."""
    torchvision_shim.install()
    import timm

    own = timm.models.get_pretrained_cfg(name).input_size[-1]
    failure = None
    for kwargs, size in (({}, SIZE), ({"img_size": SIZE}, SIZE), ({}, own)):
        try:
            model, (image,) = TimmModel("", kwargs, size).make(name)
            with torch.no_grad():
                model(image)
            return model, (image,)
        except Exception as err:  # the next form, or the first failure raised
            failure = failure or err
    raise failure


MODELS = {f"timm-{name}": (lambda name=name: make(name)) for name in NAMES}
